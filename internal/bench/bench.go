package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/seal"
)

// Machine is what the numbers were measured on.
type Machine struct {
	Cores      int    `json:"cores"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	CPU        string `json:"cpu"`
	LoadStart  string `json:"load_start"`
	LoadEnd    string `json:"load_end"`
	NATSServer string `json:"nats_server"`
	NATSGo     string `json:"nats_go"`
}

func machine() Machine {
	m := Machine{
		Cores: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, LoadStart: loadAvg(), NATSServer: server.VERSION, NATSGo: nats.Version,
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Run performs a bench run and returns its report. Measurement failures
// are recorded in the report's Errors (the run goes on); an error return
// means the harness could not run at all.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	start := time.Now()
	r := &Report{Started: start, Machine: machine(), Params: cfg.Params()}
	keys, err := seal.NewFile("k1").Ring()
	if err != nil {
		return nil, err
	}
	b := &bencher{cfg: cfg, keys: keys, seqs: map[path][]step{}}
	logf := cfg.Logf
	logf("bench: %s", cfg.Params())

	needBin := cfg.Phases["procs"] || cfg.Phases["footprint"] || cfg.Phases["approvals"]
	if needBin && b.cfg.BinDir == "" {
		b.cfg.BinDir = filepath.Join(cfg.WorkDir, "bin")
		t0 := time.Now()
		if err := buildBinaries(ctx, b.cfg.BinDir); err != nil {
			return nil, err
		}
		logf("bench: built the stage binaries in %v", time.Since(t0).Round(time.Millisecond))
	}
	if cfg.Phases["profile"] {
		if err := os.MkdirAll(cfg.ProfileDir, 0o750); err != nil {
			return nil, err
		}
	}

	// The traces, which also calibrate the raw turns' payload sizes.
	for _, tc := range []struct {
		p    path
		name string
	}{
		{fastPath, "fast"},
		{approvalPath, "approval"},
	} {
		raw := rawSequence(tc.p)
		steps, err := traceTurn(cfg.WorkDir, keys, tc.p)
		if err != nil {
			r.Errors = append(r.Errors, fmt.Sprintf("trace of the %s path: %v", tc.name, err))
			if b.seqs[tc.p] == nil {
				b.seqs[tc.p] = raw
			}
			continue
		}
		seq := Sequence{Path: tc.name, Steps: steps, Writes: countWrites(steps)}
		if b.seqs[tc.p] == nil {
			seq.Raw = true
			seq.Matches, seq.Diff = sameShape(steps, raw)
			if !seq.Matches {
				r.Errors = append(r.Errors, fmt.Sprintf("the traced %s turn differs from the raw turn's sequence (update rawseq.go): %s", tc.p, seq.Diff))
			}
			b.seqs[tc.p] = calibrate(raw, steps)
		}
		r.Sequences = append(r.Sequences, seq)
		logf("bench: traced the %s path: %d steps", tc.name, len(steps))
	}

	if cfg.Phases["throughput"] {
		b.throughput(ctx, r, single)
	}
	if cfg.Phases["profile"] {
		for _, p := range []path{fastPath, approvalPath, gatewayPath} {
			s, err := b.tollgate(modeAllInOne, p, single, true)
			if err != nil {
				r.Errors = append(r.Errors, fmt.Sprintf("profile of the %s path: %v", p, err))
				continue
			}
			r.Notes = append(r.Notes, fmt.Sprintf("Profiled all-in-one %s run: %d turns in the %v window (%.0f turns/s), %.0f allocations and %.0f KiB per turn, CPU %.2f ms per turn (whole process).",
				p, s.Count, cfg.Duration, s.Rate, s.AllocsPerTurn, s.BytesPerTurn/1024, s.CPUPerTurn))
		}
		r.Notes = append(r.Notes, fmt.Sprintf("CPU and allocation profiles of the all-in-one windows (one run per path) in %s: cpu-<path>.pprof; allocs-<path>.pprof minus allocs-<path>-base.pprof (go tool pprof -sample_index=alloc_objects -diff_base ...).", cfg.ProfileDir))
	}
	if cfg.Phases["latency"] {
		b.latencies(ctx, r)
	}
	if cfg.Phases["footprint"] {
		logf("bench: footprint with %d pending approvals", cfg.Pending)
		fp, err := b.footprintRun()
		if err != nil {
			r.Errors = append(r.Errors, fmt.Sprintf("footprint: %v", err))
		} else {
			r.Footprint = &fp
		}
	}
	if cfg.Phases["sync"] {
		b.throughput(ctx, r, singleSynced)
	}
	if cfg.Phases["cluster"] {
		// The throughput figures on a three-node cluster, R3 streams and
		// buckets, both sync settings: whether Raft's batching of the
		// writes in flight into one appendEntry (one fsync per node each)
		// gives group commit at full durability.
		b.throughput(ctx, r, storage{Nodes: 3})
		b.throughput(ctx, r, storage{Sync: true, Nodes: 3})
	}
	if cfg.Phases[phaseLayout] {
		b.layouts(ctx, r)
	}
	if cfg.Phases["toolservice"] {
		b.toolService(ctx, r)
	}
	if cfg.Phases["gateway"] {
		b.gateway(ctx, r)
	}
	if cfg.Phases["planner"] {
		b.planner(ctx, r)
	}
	if cfg.Phases["inbox"] {
		b.inbox(ctx, r)
	}
	if cfg.Phases["approvals"] {
		b.approvals(ctx, r)
	}
	r.targets(cfg)
	r.notes(cfg)
	r.Machine.LoadEnd = loadAvg()
	r.Wall = time.Since(start).Round(time.Second).String()
	return r, nil
}

// scenario is one throughput figure's measurement.
type scenario struct {
	name, mode, unit string
	path             *path
	run              func() (sample, error)
}

// throughput measures every throughput figure Runs times, interleaved
// (round after round of every scenario), so that the raw references and
// Tollgate see the same machine load; then computes the efficiencies.
func (b *bencher) throughput(ctx context.Context, r *Report, st storage) {
	fast, appr := fastPath, approvalPath
	var sc []scenario
	sc = append(sc,
		scenario{name: "raw JetStream async publish", unit: "msgs/s", run: func() (sample, error) { return b.rawPublish(st) }},
		scenario{name: "raw pull consume + ack", unit: "msgs/s", run: func() (sample, error) { return b.rawConsume(st) }},
	)
	for _, p := range []*path{&fast, &appr} {
		sc = append(sc, scenario{name: "raw turn", mode: modeAllInOne, unit: "turns/s", path: p, run: func() (sample, error) { return b.rawTurn(*p, st) }},
			scenario{name: "tollgate", mode: modeAllInOne, unit: "turns/s", path: p, run: func() (sample, error) { return b.tollgate(modeAllInOne, *p, st, false) }})
		if b.cfg.Phases["procs"] && st.Nodes <= 1 {
			sc = append(sc, scenario{name: "raw turn", mode: modeProcesses, unit: "turns/s", path: p, run: func() (sample, error) { return b.rawTurnProcs(*p, st) }},
				scenario{name: "tollgate", mode: modeProcesses, unit: "turns/s", path: p, run: func() (sample, error) { return b.tollgate(modeProcesses, *p, st, false) }})
		}
	}
	samples := b.measure(ctx, r, st, sc)
	// Efficiencies: per round, Tollgate over the raw turn of the same round
	// and mode.
	for _, p := range []path{fastPath, approvalPath} {
		for i, s := range sc {
			if s.name != "tollgate" || *s.path != p {
				continue
			}
			rawIdx := slices.IndexFunc(sc, func(r scenario) bool { return r.name == "raw turn" && r.mode == s.mode && *r.path == p })
			if rawIdx < 0 {
				continue
			}
			var per []float64
			for k := range samples[i] {
				if raw := samples[rawIdx][k].Rate; raw > 0 && samples[i][k].Rate > 0 {
					per = append(per, samples[i][k].Rate/raw)
				}
			}
			ratio := Ratio{Sync: st.String(), Path: p.String(), Mode: s.mode}
			tg := r.figure(st.String(), "tollgate", s.mode, p.String())
			raw := r.figure(st.String(), "raw turn", s.mode, p.String())
			if tg != nil && raw != nil && raw.Median > 0 {
				ratio.Efficiency = tg.Median / raw.Median
			}
			ratio.RoundMedian, ratio.RoundMin, ratio.RoundMax = median(per)
			r.Efficiency = append(r.Efficiency, ratio)
		}
	}
}

// measure runs every scenario of sc Runs times, interleaved (round after
// round of every scenario, so that all see the same machine load), adds a
// throughput figure per scenario to r, and returns the samples, per
// scenario and round.
func (b *bencher) measure(ctx context.Context, r *Report, st storage, sc []scenario) [][]sample {
	samples := make([][]sample, len(sc))
	for round := 1; round <= b.cfg.Runs && ctx.Err() == nil; round++ {
		for i, s := range sc {
			ps := ""
			if s.path != nil {
				ps = s.path.String()
			}
			smp, err := s.run()
			if err != nil {
				r.Errors = append(r.Errors, fmt.Sprintf("sync %s, %s %s %s, round %d: %v", st.String(), s.name, s.mode, ps, round, err))
				samples[i] = append(samples[i], sample{})
				continue
			}
			samples[i] = append(samples[i], smp)
			b.cfg.Logf("bench: sync %s round %d: %s %s %s: %.0f %s", st.String(), round, s.name, s.mode, ps, smp.Rate, s.unit)
		}
	}
	for i, s := range sc {
		var rates []float64
		for _, smp := range samples[i] {
			if smp.Rate > 0 {
				rates = append(rates, smp.Rate)
			}
		}
		f := Figure{Sync: st.String(), Name: s.name, Mode: s.mode, Unit: s.unit, Samples: samples[i]}
		if s.path != nil {
			f.Path = s.path.String()
		}
		f.Median, f.Min, f.Max = median(rates)
		r.Throughput = append(r.Throughput, f)
	}
	return samples
}

// latencies runs, for each mode and path, an open loop at the low rate and
// at 80% of the measured peak (the median closed-loop rate; measured now
// with one run if the throughput phase did not run).
func (b *bencher) latencies(ctx context.Context, r *Report) {
	modes := []string{modeAllInOne}
	if b.cfg.Phases["procs"] {
		modes = append(modes, modeProcesses)
	}
	for _, mode := range modes {
		for _, p := range []path{fastPath, approvalPath} {
			peak := 0.0
			if f := r.figure("default", "tollgate", mode, p.String()); f != nil {
				peak = f.Median
			}
			if peak <= 0 {
				s, err := b.tollgate(mode, p, single, false)
				if err != nil {
					r.Errors = append(r.Errors, fmt.Sprintf("latency peak of %s %s: %v", mode, p, err))
					continue
				}
				peak = s.Rate
			}
			for _, load := range []struct {
				name string
				rate float64
			}{{"low", min(b.cfg.LowRate, peak/2)}, {"80% of peak", 0.8 * peak}} {
				if ctx.Err() != nil {
					return
				}
				ls, err := b.latency(mode, p, load.rate)
				if err != nil {
					r.Errors = append(r.Errors, fmt.Sprintf("latency %s %s %s: %v", mode, p, load.name, err))
					continue
				}
				row := ls.row(mode, p, load.name)
				r.Latency = append(r.Latency, row)
				b.cfg.Logf("bench: latency %s %s at %s (%.0f/s): outcome p50 %.2f ms p99 %.2f ms", mode, p, load.name, load.rate, row.Outcome.P50, row.Outcome.P99)
			}
		}
	}
}

// row is the latency row of ls, a run of p in mode at load.
func (ls latSample) row(mode string, p path, load string) LatRow {
	row := LatRow{Mode: mode, Path: p.String(), Load: load, Rate: ls.Rate, Achieved: ls.Achieved, Sent: ls.Sent, Timeouts: ls.Timeouts, Outcome: percentiles(ls.Outcome)}
	if p.decided() {
		d, f, c := percentiles(ls.Decision), percentiles(ls.Finished), percentiles(ls.Call)
		row.Decision, row.Finished, row.Call = &d, &f, &c
	}
	return row
}

// toolService is the toolservice phase: the approval path with its
// approved call built in and behind the bench's NATS tool service
// (toolServicePath), all-in-one. Closed-loop turns/s, Runs rounds with the
// two measured back to back in each; then an open loop of each at the low
// rate, for the latencies, with bare request round trips to the tool
// service measured during the tool service's run.
func (b *bencher) toolService(ctx context.Context, r *Report) {
	paths := []path{approvalPath, toolServicePath}
	samples := b.rounds(ctx, r, "toolservice", paths)
	ts := &ToolService{}
	var calls [2]*Pcts
	for i, p := range paths {
		row := ToolRow{Tool: "write_file (built in)", Throughput: allInOneFigure(p, samples[i])}
		if p == toolServicePath {
			row.Tool = benchTool + " (NATS tool service)"
		}
		if ctx.Err() == nil {
			ls, err := b.latency(modeAllInOne, p, b.cfg.LowRate)
			if err != nil {
				r.Errors = append(r.Errors, fmt.Sprintf("toolservice, %s path, latency: %v", p, err))
			} else {
				row.Latency = ls.row(modeAllInOne, p, "low")
				calls[i] = row.Latency.Call
				if p == toolServicePath {
					ts.RoundTrip = percentiles(ls.RoundTrips)
				}
				b.cfg.Logf("bench: toolservice latency %s at %.0f/s: call p50 %.3f ms", p, b.cfg.LowRate, row.Latency.Call.P50)
			}
		}
		ts.Rows = append(ts.Rows, row)
	}
	ts.RatioMedian, ts.RatioMin, ts.RatioMax = roundRatios(samples[1], samples[0])
	if calls[0] != nil && calls[1] != nil {
		ts.HopP50, ts.HopP99 = calls[1].P50-calls[0].P50, calls[1].P99-calls[0].P99
	}
	r.ToolService = ts
}

// rounds measures each of paths all-in-one in a closed loop, Runs rounds
// with the paths back to back in each, and returns their samples (a
// failed run is a report error and a zero sample).
func (b *bencher) rounds(ctx context.Context, r *Report, phase string, paths []path) [][]sample {
	samples := make([][]sample, len(paths))
	for round := 1; round <= b.cfg.Runs && ctx.Err() == nil; round++ {
		for i, p := range paths {
			s, err := b.tollgate(modeAllInOne, p, single, false)
			if err != nil {
				r.Errors = append(r.Errors, fmt.Sprintf("%s, %s path, round %d: %v", phase, p, round, err))
				s = sample{}
			} else {
				b.cfg.Logf("bench: %s round %d: %s: %.0f turns/s", phase, round, p, s.Rate)
			}
			samples[i] = append(samples[i], s)
		}
	}
	return samples
}

// allInOneFigure is the throughput figure of p's all-in-one samples.
func allInOneFigure(p path, samples []sample) Figure {
	f := Figure{Sync: "default", Name: "tollgate", Mode: modeAllInOne, Path: p.String(), Unit: "turns/s", Samples: samples}
	var rates []float64
	for _, s := range samples {
		if s.Rate > 0 {
			rates = append(rates, s.Rate)
		}
	}
	f.Median, f.Min, f.Max = median(rates)
	return f
}

// roundRatios are the median, min and max over the rounds of a's rate ÷
// b's (rounds where either failed left out).
func roundRatios(a, b []sample) (med, lo, hi float64) {
	var per []float64
	for k := range min(len(a), len(b)) {
		if a[k].Rate > 0 && b[k].Rate > 0 {
			per = append(per, a[k].Rate/b[k].Rate)
		}
	}
	return median(per)
}

// gateway is the gateway phase: the approval path's turn submitted and
// decided over NATS (the driver and its decider) and over the HTTP
// gateway (gatewayPath: each slot submits, decides with the digest shown,
// and waits for the turn's end over the API), all-in-one, in a closed
// loop at the configured concurrency, Runs rounds with the two back to
// back in each. The latencies are the closed loops' turns inside the
// windows, all rounds together.
func (b *bencher) gateway(ctx context.Context, r *Report) {
	paths := []path{approvalPath, gatewayPath}
	samples := b.rounds(ctx, r, "gateway", paths)
	g := &Gateway{}
	for i, p := range paths {
		row := GatewayRow{Transport: "NATS (driver and decider)", Throughput: allInOneFigure(p, samples[i])}
		if p == gatewayPath {
			row.Transport = "HTTP gateway (in process)"
		}
		var pending, completed, turn []time.Duration
		for _, s := range samples[i] {
			for _, t := range s.turns {
				pending = append(pending, t.pending.Sub(t.sent))
				completed = append(completed, t.done.Sub(t.decided))
				turn = append(turn, t.done.Sub(t.sent))
			}
		}
		row.Pending, row.Completed, row.Turn = percentiles(pending), percentiles(completed), percentiles(turn)
		g.Rows = append(g.Rows, row)
	}
	g.RatioMedian, g.RatioMin, g.RatioMax = roundRatios(samples[1], samples[0])
	added := func(of func(GatewayRow) Pcts) Added {
		n, h := of(g.Rows[0]), of(g.Rows[1])
		return Added{P50: h.P50 - n.P50, P99: h.P99 - n.P99}
	}
	g.AddedPending = added(func(r GatewayRow) Pcts { return r.Pending })
	g.AddedCompleted = added(func(r GatewayRow) Pcts { return r.Completed })
	g.AddedTurn = added(func(r GatewayRow) Pcts { return r.Turn })
	r.Gateway = g
}

// targets judges the report against Tollgate's performance targets:
// efficiency against the raw turn, decision-to-run latency, the NATS tool
// service hop, worker memory and KV bytes per pending approval.
func (r *Report) targets(cfg Config) {
	for _, e := range r.Efficiency {
		if e.Sync != "default" {
			continue
		}
		// Judged on the median of the per-round ratios: each pairs Tollgate
		// with the raw turn measured just before it, so a shared machine's
		// load drifting between rounds cancels out.
		r.Targets = append(r.Targets, Target{
			Name: fmt.Sprintf("efficiency, %s path, %s", e.Path, e.Mode), Want: ">= 0.70 (per-round median)",
			Got:  fmt.Sprintf("%.2f (rounds %.2f-%.2f; median ÷ median %.2f)", e.RoundMedian, e.RoundMin, e.RoundMax, e.Efficiency),
			Pass: e.RoundMedian >= 0.7,
		})
	}
	for _, l := range r.Latency {
		if l.Decision == nil || l.Load != "low" {
			continue
		}
		r.Targets = append(r.Targets, Target{
			Name: "decision -> approved call started p99, low load, " + l.Mode, Want: "<= 5 ms",
			Got: fmt.Sprintf("%.2f ms (n=%d)", l.Decision.P99, l.Decision.N), Pass: l.Decision.N > 0 && l.Decision.P99 <= 5,
		})
	}
	if in := r.Inbox; in != nil && len(in.Pages) > 0 {
		pg := in.Pages[0] // the default first page
		r.Targets = append(r.Targets,
			Target{Name: fmt.Sprintf("web inbox first page p95, %d pending", in.Pending), Want: "<= 300 ms",
				Got: fmt.Sprintf("%.1f ms (p50 %.1f, n=%d)", pg.P95, pg.P50, pg.N), Pass: pg.N > 0 && pg.P95 <= 300},
			Target{Name: fmt.Sprintf("web inbox first page HTML, %d pending", in.Pending), Want: "<= 150 KiB",
				Got: fmt.Sprintf("%.1f KiB (%d rows)", float64(pg.Bytes)/1024, pg.Rows), Pass: pg.Bytes > 0 && pg.Bytes <= 150<<10})
	}
	if a := r.Approvals; a != nil && len(a.Sweeps) > 0 {
		r.Targets = append(r.Targets,
			Target{Name: fmt.Sprintf("gateway RSS, %d clients listing %d pending approvals", listClients, a.Pending), Want: "< 200 MB",
				Got: fmt.Sprintf("%.1f MB peak (%.1f MB idle)", float64(a.RSSPeak)/1e6, float64(a.RSSIdle)/1e6), Pass: a.RSSPeak > 0 && a.RSSPeak < 200e6})
		for _, sw := range a.Sweeps {
			r.Targets = append(r.Targets, Target{Name: fmt.Sprintf("GET /v1/approvals page p99, limit %d, %d clients, %d pending", sw.Limit, listClients, a.Pending),
				Want: "< 50 ms", Got: fmt.Sprintf("%.1f ms (p50 %.1f, n=%d)", sw.P99, sw.P50, sw.N), Pass: sw.N > 0 && sw.P99 < 50})
		}
	}
	if ts := r.ToolService; ts != nil && ts.RoundTrip.N > 0 && len(ts.Rows) == 2 && ts.Rows[0].Latency.Call != nil && ts.Rows[1].Latency.Call != nil {
		// The remote hop should cost one request round trip: the hop is a
		// difference of two medians, the round trip a median of its own,
		// all from one run, so allow for noise.
		r.Targets = append(r.Targets, Target{
			Name: "NATS tool service hop: approved call time p50, tool service - built in, low load", Want: "<= 2 x a bare request round trip p50 (same run)",
			Got:  fmt.Sprintf("%.3f ms (round trip p50 %.3f ms)", ts.HopP50, ts.RoundTrip.P50),
			Pass: ts.HopP50 <= 2*ts.RoundTrip.P50,
		})
	}
	if g := r.Gateway; g != nil && g.RatioMedian > 0 {
		r.Targets = append(r.Targets, Target{
			Name: "HTTP gateway: turns/s over HTTP ÷ over NATS, approval turn, all-in-one", Want: ">= 0.80 (per-round median)",
			Got:  fmt.Sprintf("%.2f (rounds %.2f-%.2f)", g.RatioMedian, g.RatioMin, g.RatioMax),
			Pass: g.RatioMedian >= 0.8,
		})
	}
	if f := r.Footprint; f != nil {
		note := ""
		if f.Pending < 100000 {
			note = fmt.Sprintf("measured with %d pending, not 100,000: run make bench-footprint", f.Pending)
		}
		worst, who := int64(0), ""
		for _, s := range stageNames {
			if f.RSSPending[s] > worst {
				worst, who = f.RSSPending[s], s
			}
		}
		r.Targets = append(r.Targets, Target{
			Name: "worker RSS with pending approvals (largest)", Want: "<= 100 MiB with 100k pending",
			Got: fmt.Sprintf("%s (%s)", mib(worst), who), Pass: worst <= 100<<20, Note: note,
		})
		per := 0.0
		if f.ApprovalMsgs > 0 {
			per = float64(f.ApprovalBytes) / float64(f.ApprovalMsgs)
		}
		r.Targets = append(r.Targets, Target{
			Name: "KV bytes per pending approval (approvals bucket)", Want: "<= 1024 B",
			Got: fmt.Sprintf("%.0f B (all buckets and turn logs: %.0f B per pending turn)", per, float64(f.AllKVBytes)/float64(max(f.Pending, 1))), Pass: per <= 1024, Note: note,
		})
	}
}

// notes explains how the figures were obtained.
func (r *Report) notes(cfg Config) {
	r.Notes = append(r.Notes,
		"Every measured run starts a fresh embedded nats-server (JetStream, file storage in its own directory, 127.0.0.1) in this process; the Tollgate processes and the raw programs connect to it over loopback. Runs of all figures are interleaved round by round, so the per-round efficiency compares Tollgate and the raw turn under the same machine load.",
		"Closed loop: each of the concurrency slots sends a turn and waits for its outcome before sending the next, cycling over 4 sessions of its own (each turn finds its session known and free). Counted: outcomes received in the window, after the warm-up.",
		"Raw turn: rawStages runs the traced sequence (below) with the same consumers, pull size, ack mode and per-stage concurrency as Tollgate's runners, payloads of the traced sizes, no decoding, policy, seal, logging or tool; its approver holds the same KV watch on the approvals bucket as Tollgate's pending tracker. The driver and decider are the same for both. All-in-one: the four raw stages in this process on one connection; processes: one process (and connection) per raw stage, the reference for Tollgate's stage processes.",
		"All-in-one: the four stages wired by tollgate.New (as `tollgate dev`), one NATS connection, in this process. Processes: the four stages as `tollgate <stage>` (built from this tree), one process each. Stage logs at level "+cfg.LogLevel+" go to files.",
		"Allocations per turn are runtime.MemStats deltas over the window divided by completed turns, for the whole bench process (Tollgate stages, embedded nats-server, driver).",
		"Deferred redrives and early decided events per started: the executor announces nothing when a batch moves to awaiting (its turn log's append is the fact), so the redriver evaluates a batch only on a decided event (or its recovery sweep). A decided event that arrives before the executor's awaiting append (the decider answers the requested event, published just before it) is NAKed until the batch waits (20 ms doubling), which the raw redriver does too (its NAKs are the raw turn's \"NAKed for retry\"); a deferred outcome is only for a barrier still waiting for another approval, or an early event given up after 10 minutes.",
	)
	if cfg.Pending < 100000 {
		r.Notes = append(r.Notes, fmt.Sprintf("Footprint measured with BENCH_PENDING=%d (make bench); `make bench-footprint` runs it with 100,000.", cfg.Pending))
	}
}
