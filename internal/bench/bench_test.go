package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestMain lets the bench start this test binary as a raw stage process.
func TestMain(m *testing.M) {
	MaybeRunRawStage()
	os.Exit(m.Run())
}

// The raw stages, traced like Tollgate's, perform exactly the raw sequences
// (so the raw turn measures what the report says it does).
func TestRawStagesPerformTheRawSequences(t *testing.T) {
	for _, p := range []path{fastPath, approvalPath} {
		e, js := connectedEnv(t, single, "raw")
		r, err := startRawStages(js, rawSequence(p), p)
		if err != nil {
			t.Fatal(err)
		}
		steps, err := traceOn(e, r, p, true)
		r.close()
		if err != nil {
			t.Fatal(err)
		}
		for i := range steps {
			steps[i].On = strings.Replace(steps[i].On, "/"+rawConsumer(""), "/", 1)
		}
		if ok, diff := sameShape(steps, rawSequence(p)); !ok {
			t.Errorf("%s path: the raw stages do not perform the raw sequence: %s", p, diff)
		}
		if n := r.errs.Load(); n > 0 {
			t.Errorf("%s path: %d raw stage errors, last %v", p, n, r.lastErr.Load())
		}
	}
}

// smokeConfig is a bench run with tiny counts. A throughput window stays
// open until a turn ended in it (MinTurns): a slot's first turns pay for
// the stages' cold start (first consumers, first KV reads), and under the
// load of a parallel `make test` on 2 cores a short fixed window could end
// before any turn did ("no turn completed in the window"); the smoke
// checks that every figure is produced, not how fast, so the windows are
// as short as that allows.
func smokeConfig(t *testing.T, phases ...string) Config {
	c := Config{
		Runs: 1, Duration: 200 * time.Millisecond, Warmup: 50 * time.Millisecond, MinTurns: 1, Concurrency: 4,
		ConsumeMsgs: 500, LowRate: 20, LatencyDuration: 200 * time.Millisecond, Pending: 20,
		Phases: map[string]bool{}, LogLevel: "info", WorkDir: t.TempDir(), ToolDir: t.TempDir(), Logf: t.Logf,
		BinDir: os.Getenv("BENCH_BIN"), // prebuilt binaries (tollgate runs the stages), or built into WorkDir
	}
	if c.BinDir == "" {
		c.BinDir = os.Getenv(childproc.EnvBin) // make test's
	}
	for _, p := range phases {
		c.Phases[p] = true
	}
	return c
}

// runSmoke runs the harness and checks what every run must give: no
// errors (a traced turn that no longer matches its raw sequence is one:
// update rawseq.go), a rate for every figure, the two traces.
func runSmoke(t *testing.T, cfg Config, figures int) *Report {
	t.Helper()
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Errors {
		t.Errorf("report error: %s", e)
	}
	if len(r.Sequences) != 2 {
		t.Errorf("%d traced sequences, want 2", len(r.Sequences))
	}
	if len(r.Throughput) != figures {
		t.Errorf("%d throughput figures, want %d", len(r.Throughput), figures)
	}
	for _, f := range r.Throughput {
		if f.Median <= 0 {
			t.Errorf("%s %s: no rate", f.Sync, f.label())
		}
	}
	if len(r.Efficiency) == 0 || len(r.Targets) == 0 {
		t.Errorf("efficiency %d, target %d rows", len(r.Efficiency), len(r.Targets))
	}
	return r
}

// benchRun skips a test that runs the benchmark (a smoke run of its
// phases: seconds of closed loops on both cores, or the stage binaries)
// under -short: make test leaves such runs to make test-long.
func benchRun(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("a benchmark run, skipped with -short (make test-long runs it)")
	}
}

// TestBenchSmoke runs the harness's all-in-one phases with tiny counts, so
// that it does not rot between `make bench` runs, and writes the report.
// (The sync phase is the throughput phase on servers with SyncAlways.)
func TestBenchSmoke(t *testing.T) {
	benchRun(t)
	cfg := smokeConfig(t, "throughput", "latency")
	cfg.ProfileDir = t.TempDir() // the open loops' profiles, without the profile phase
	r := runSmoke(t, cfg, 2+2*2) // raw turn and tollgate, per path
	if len(r.Latency) != 4 {
		t.Errorf("%d latency rows, want 4", len(r.Latency))
	}
	for _, row := range r.Latency {
		for _, kind := range []string{"cpu", "heap"} {
			name := filepath.Join(cfg.ProfileDir, fmt.Sprintf("%s-latency-%s-%.0f.pprof", kind, row.Path, row.Rate))
			if fi, err := os.Stat(name); err != nil || fi.Size() == 0 {
				t.Errorf("%s open loop at %s: no %s profile: %v", row.Path, row.Load, kind, err)
			}
		}
	}
	paths, err := r.WriteFiles(t.TempDir())
	if err != nil || len(paths) != 4 {
		t.Fatalf("write files: %v %v", paths, err)
	}
	md, _ := os.ReadFile(paths[1])
	for _, s := range []string{"## Targets", "## Throughput", "## Efficiency", "## Latency", "cores", "raw turn's sequence matches"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("markdown report has no %q", s)
		}
	}
}

// TestBenchSmokeProcesses runs the phases with the stage binaries as
// separate processes (built from this tree unless BENCH_BIN names them):
// throughput and the footprint, with tiny counts.
func TestBenchSmokeProcesses(t *testing.T) {
	benchRun(t)
	// The smoke tests marked parallel run beside each other: mostly
	// builds, process starts and short fixed windows, each on servers and
	// directories of its own; they check that every figure is produced,
	// not how fast.
	t.Parallel()
	r := runSmoke(t, smokeConfig(t, "throughput", "procs", "footprint"), 2+2*4)
	if f := r.Footprint; f == nil || f.Outcomes < 20 || f.RSSPending["approver"] == 0 || f.ApprovalMsgs == 0 {
		t.Errorf("footprint: %+v", f)
	}
}

// TestBenchSmokeToolService runs the toolservice phase with tiny counts:
// both approved calls (built in, and behind the bench's NATS tool service)
// measured, every outcome checked ok (an approved call the tool service
// did not answer would be a report error), the hop and the round trip
// reported.
func TestBenchSmokeToolService(t *testing.T) {
	benchRun(t)
	t.Parallel() // see TestBenchSmokeProcesses
	r, err := Run(context.Background(), smokeConfig(t, "toolservice"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Errors {
		t.Errorf("report error: %s", e)
	}
	ts := r.ToolService
	if ts == nil || len(ts.Rows) != 2 {
		t.Fatalf("tool service comparison: %+v", ts)
	}
	for _, row := range ts.Rows {
		if row.Throughput.Median <= 0 || row.Latency.Call == nil || row.Latency.Call.N == 0 || row.Latency.Finished.N == 0 {
			t.Errorf("%s: no figures: %+v", row.Tool, row)
		}
	}
	if !strings.Contains(ts.Rows[1].Tool, benchTool) || ts.RoundTrip.N == 0 || ts.RatioMedian <= 0 {
		t.Errorf("tool service row %q, round trips %+v, ratio %.2f", ts.Rows[1].Tool, ts.RoundTrip, ts.RatioMedian)
	}
	var md strings.Builder
	r.Markdown(&md)
	if !strings.Contains(md.String(), "## Approved call behind a NATS tool service") {
		t.Errorf("markdown report has no tool service section")
	}
}

// TestBenchSmokeGateway runs the gateway phase with tiny counts: the
// approval turn over NATS and over the HTTP gateway both measured, every
// turn of each run completed with every call ok (a turn that failed or
// did not end over HTTP, or an outcome not ok, would be a report error),
// the latencies of both reported, and the target judged.
func TestBenchSmokeGateway(t *testing.T) {
	benchRun(t)
	t.Parallel() // see TestBenchSmokeProcesses
	r, err := Run(context.Background(), smokeConfig(t, "gateway"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Errors {
		t.Errorf("report error: %s", e)
	}
	g := r.Gateway
	if g == nil || len(g.Rows) != 2 {
		t.Fatalf("gateway comparison: %+v", g)
	}
	for _, row := range g.Rows {
		f := row.Throughput
		if f.Median <= 0 || row.Pending.N == 0 || row.Completed.N == 0 || row.Turn.N != f.Samples[0].Count {
			t.Errorf("%s: no figures: %+v", row.Transport, row)
		}
		for _, s := range f.Samples {
			if s.Timeouts > 0 || s.Errors > 0 {
				t.Errorf("%s: %d turns timed out, %d failed", row.Transport, s.Timeouts, s.Errors)
			}
		}
	}
	if g.Rows[1].Throughput.Path != gatewayPath.String() || g.RatioMedian <= 0 {
		t.Errorf("HTTP row %q, ratio %.2f", g.Rows[1].Throughput.Path, g.RatioMedian)
	}
	var md strings.Builder
	r.Markdown(&md)
	for _, s := range []string{"## Approval turns over the HTTP gateway and over NATS", "| HTTP gateway (in process) |", "| NATS (driver and decider) |", "turns/s over HTTP ÷ over NATS"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown report has no %q", s)
		}
	}
}

// TestBenchSmokePlanner runs the planner phase with tiny counts: the
// planner turn (scripted model, echo then the answer) measured next to the
// fast and approval turns, every outcome ok (a planner turn that failed,
// or whose step batch failed, would be a report error), and for every
// planner turn in the windows its publish for the planner, its step
// batch's schedule and outcome seen, so that the overhead per step is
// computed from each.
func TestBenchSmokePlanner(t *testing.T) {
	benchRun(t)
	t.Parallel() // see TestBenchSmokeProcesses
	// A planner turn takes about 250 ms (the message schedule of its
	// step): the windows stay open until one ended (smokeConfig).
	r, err := Run(context.Background(), smokeConfig(t, "planner"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Errors {
		t.Errorf("report error: %s", e)
	}
	pl := r.Planner
	if pl == nil || len(pl.Loaded.Rows) != 3 || len(pl.Single.Rows) != 2 {
		t.Fatalf("planner comparison: %+v", pl)
	}
	for _, l := range []PlannerLoad{pl.Loaded, pl.Single} {
		for _, row := range l.Rows {
			f := row.Throughput
			if f.Median <= 0 || row.Turn.N != f.Samples[0].Count {
				t.Errorf("%s at %d in flight: no figures: %+v", row.Path, l.InFlight, row)
			}
			for _, s := range f.Samples {
				if s.Timeouts > 0 || s.Errors > 0 {
					t.Errorf("%s at %d in flight: %d turns timed out, %d failed", row.Path, l.InFlight, s.Timeouts, s.Errors)
				}
			}
		}
		planned := l.Rows[len(l.Rows)-1]
		if planned.Path != plannerPath.String() || l.Overhead.N != planned.Turn.N || l.Batch.N != planned.Turn.N || l.ModelMsPerCall <= 0 {
			t.Errorf("at %d in flight: %s row of %d turns, overhead over %d, batch over %d, model %.2f ms", l.InFlight, planned.Path, planned.Turn.N, l.Overhead.N, l.Batch.N, l.ModelMsPerCall)
		}
		if l.Overhead.P50 <= 0 || l.Overhead.P50 >= planned.Turn.P50 {
			t.Errorf("at %d in flight: overhead per step p50 %.2f ms, turn p50 %.2f ms", l.InFlight, l.Overhead.P50, planned.Turn.P50)
		}
	}
	var md strings.Builder
	r.Markdown(&md)
	for _, s := range []string{"## A planner turn next to the plain turns", "| planner (echo, then the answer) | 1 |", "Planner overhead per step"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown report has no %q", s)
		}
	}
}

// An outcome counts only as a completed turn whose calls all returned ok.
func TestNotOK(t *testing.T) {
	ok := schemas.ToolResult{CallID: "t-1-0", Tool: "echo", Status: schemas.ResultOK}
	for _, c := range []struct {
		name string
		o    schemas.TurnOutcome
		bad  bool
	}{
		{"completed, every call ok", schemas.TurnOutcome{State: schemas.TurnCompleted, Results: []schemas.ToolResult{ok, ok}}, false},
		{"failed turn", schemas.TurnOutcome{State: schemas.TurnFailed, Code: schemas.CodeToolNotFound}, true},
		{"completed with a failed call", schemas.TurnOutcome{State: schemas.TurnCompleted, Results: []schemas.ToolResult{ok,
			{CallID: "t-1-1", Tool: benchTool, Status: schemas.ResultFailed, Code: schemas.CodeToolNotFound}}}, true},
		{"completed with a call needing attention", schemas.TurnOutcome{State: schemas.TurnCompleted, Results: []schemas.ToolResult{
			{CallID: "t-1-1", Tool: benchTool, Status: schemas.ResultNeedsAttention, Code: schemas.CodeExecutionUncertain}}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := notOK(&c.o); (got != "") != c.bad {
				t.Errorf("notOK = %q, want bad=%v", got, c.bad)
			}
		})
	}
}

// TestDurableWritesPerTurn counts the raw sequences' durable writes (the
// traced turns match them, TestRawStagesPerformTheRawSequences): every
// stream publish (a turn log's append among them) and KV create or
// update, not reads, failed creates or consumer acknowledgements. The
// batch record's writes are appends to the turn's log: fast 2 (created
// running with call 0 claimed, completed), approval 4 (and awaiting,
// started). A turn whose turn has come (its predecessor in its session's
// order ended) is created running: the queued record that came first (a
// write of its own) is only written for a turn that must wait. Nothing
// is written for the session: the order's entry (the accepted turn) and
// the batches' ends are its state (docs/protocol.md §1.4). No event is
// published for the awaiting and started appends (issue 36, one write
// per fact): the approval turn's publishes are the inbound message, the
// accepted turn and the turn log's appends (running, awaiting, started,
// outcome); its KV writes the approval's creation and its decision. The
// decision is sent to the approver's service as a request, which no
// stream keeps: the approval record's revision is its one write. Nor is
// the outcome published: the turn log's outcome append keeps it.
func TestDurableWritesPerTurn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
		want  Writes
	}{
		{"the fast turn", rawFast, Writes{Publishes: 4, KV: 0, Total: 4}},
		{"the approval turn", rawApproval, Writes{Publishes: 6, KV: 2, Total: 8}},
		{"a request and its answer are no write", []step{{Op: "request"}, {Op: "answer"}}, Writes{}},
		{"a failed create is no write", []step{{Op: opCreateExists}, {Op: "kv.get"}, {Op: "stream.get"}, {Op: "consume+ack"}}, Writes{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := countWrites(tc.steps); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestClusterEnv: the cluster phase's servers form one JetStream cluster
// whose streams, buckets and turn logs have three replicas, each on a node
// of its own, and a client given the URL list reaches it.
func TestClusterEnv(t *testing.T) {
	st := storage{Sync: true, Nodes: 3}
	if st.String() != "always R3" || single.String() != "default" {
		t.Fatalf("labels %q and %q", st.String(), single.String())
	}
	_, js := connectedEnv(t, st, "cluster-check")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{topology.StreamInbound, "KV_" + topology.BucketBatches, topology.TurnLogStream(0)} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("stream %s: %d replicas configured, cluster %+v; want 3 on 3 nodes", name, info.Config.Replicas, info.Cluster)
		}
	}
}

// connectedEnv starts the bench's servers on st for t and connects a
// client named name; both are closed when t ends.
func connectedEnv(t *testing.T, st storage, name string) (*env, jetstream.JetStream) {
	t.Helper()
	e, err := startEnv(t.TempDir(), st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	nc, js, err := e.connect(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return e, js
}

// A closed loop with MinTurns keeps its window open until that many turns
// ended in it, and takes the rate over the window's real length; without,
// a window shorter than a turn ends empty.
func TestClosedLoopWindowWaitsForMinTurns(t *testing.T) {
	slow := func(ctx context.Context, _ string) (turnTimes, error) {
		time.Sleep(300 * time.Millisecond)
		return turnTimes{done: now()}, nil
	}
	if res := closedLoop(context.Background(), "fixed", 1, 1, 0, 0, 50*time.Millisecond, nil, slow); res.Completed != 0 || res.Window != 50*time.Millisecond {
		t.Fatalf("fixed window: %d turns in %v, want 0 in 50ms", res.Completed, res.Window)
	}
	opened, closed := 0, 0
	res := closedLoop(context.Background(), "min", 2, 1, 2, 0, 50*time.Millisecond, func(open bool) {
		if open {
			opened++
		} else {
			closed++
		}
	}, slow)
	if res.Completed < 2 || res.Window < 300*time.Millisecond || res.Window > turnTimeout || res.rate() <= 0 {
		t.Fatalf("window with MinTurns 2: %d turns in %v", res.Completed, res.Window)
	}
	if opened != 1 || closed != 1 {
		t.Fatalf("window opened %d and closed %d times, want once each", opened, closed)
	}
}

// TestBenchSmokeLayout runs the layout phase with tiny counts: every layout
// of both paths, both sync settings, produces a rate with no errors (a raw
// stage that failed a write, or a turn that never ended, is one), and the
// two designs' figures count their writes per turn.
func TestBenchSmokeLayout(t *testing.T) {
	benchRun(t)
	t.Parallel() // see TestBenchSmokeProcesses
	cfg := smokeConfig(t, phaseLayout)
	// Every layout.
	cfg.Layouts = []string{"today", "state", "records", "events"}
	cfg.LayoutPartitions = []int{2}
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Errors {
		t.Errorf("report error: %s", e)
	}
	if len(r.Throughput) != 2*2*len(cfg.Layouts) {
		t.Fatalf("%d figures, want %d (two syncs, two paths, %d layouts)", len(r.Throughput), 2*2*len(cfg.Layouts), len(cfg.Layouts))
	}
	names := map[string]bool{}
	for _, f := range r.Throughput {
		names[f.Name] = true
		if f.Median <= 0 {
			t.Errorf("%s %s: no rate", f.Sync, f.label())
		}
		if strings.Contains(f.Name, "is the log") && (len(f.Samples) == 0 || f.Samples[0].WritesPerTurn <= 0) {
			t.Errorf("%s %s: no writes per turn", f.Sync, f.label())
		}
	}
	if len(names) != len(cfg.Layouts) {
		t.Errorf("layouts measured: %v, want %d", names, len(cfg.Layouts))
	}
}
