package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/policy"
)

// TestChaosShort is the short form that runs in `make test`: a few hundred
// turns, a worker kill of each kind (every stage and the remote tool
// service), one broker restart and, after the faults, one tool service
// crash between acting and replying (whose session waits out the tool
// timeout), with the stage binaries
// built without -race (the harness itself runs under -race); set
// TOLLGATE_CHAOS_RACE=1 to build them with it. TOLLGATE_CHAOS_* variables
// override the parameters (TOLLGATE_CHAOS_SEED replays a run).
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped with -short")
	}
	// Beside TestChaosPlanner: each spends most of its wall time waiting
	// (redeliveries after AckWait, the shortened leases), not on the CPU,
	// and each has its own server, processes and directories.
	t.Parallel()
	cfg := Config{
		Turns: 150, Kills: len(Workers), BrokerRestarts: 1, WriteKills: 2, Replicas: 2, Concurrency: 16, MaxSessionTurns: 4,
		ExpiresAfter: time.Second, ToolCrashes: 1, FaultFrom: 0.05, FaultTo: 0.6,
		// A worker killed between claiming a call and recording its result
		// holds the call for the claim lease, and the crashed tool service's
		// call holds its session for the tool timeout: both shortened from
		// 2 minutes and 1 so that a run takes about a minute whatever its
		// seed (`make chaos` keeps the defaults).
		ClaimLease: 30 * time.Second, ToolTimeout: 15 * time.Second,
		StallTimeout: 3 * time.Minute, MaxDuration: 8 * time.Minute,
	}
	runChaos(t, cfg)
}

// TestChaosPlanner is the short planner-mode run: sixty turns, half of
// them text-only, driven by two planner processes against the harness's
// scripted model (tool calls in one or two steps, gated ones decided by
// the harness, then the final answer), with four kills of the planner and
// ingest processes (the executor and the tool service are left alone
// here: a call whose executor dies holds its session for the 2-minute
// claim lease, which TestChaosShort and `make chaos CHAOS_PLANNER=1`
// cover), no broker restart and no tool service crash call. The checks
// add the planner's: no model step asked again after its answer was
// recorded, step batches made of their recorded steps, and every completed
// planner turn's reply under its own context. Bursts are on: turns with
// calls and text-only turns of one session published before the previous
// one ended must still end in arrival order (package sessionorder: one
// queue per session for both kinds, a loop holding its session until it
// ends).
func TestChaosPlanner(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped with -short")
	}
	t.Parallel() // beside TestChaosShort (see there)
	runChaos(t, Config{
		Turns: 60, Planner: true, PlannerPercent: 50, Replicas: 2, Concurrency: 16, MaxSessionTurns: 4,
		Kills: 4, KillOnly: []string{PlannerStage, "ingest"}, BrokerRestarts: -1,
		ExpiresAfter: time.Second, ToolCrashes: -1, FaultFrom: 0.05, FaultTo: 0.8,
		StallTimeout: 3 * time.Minute, MaxDuration: 8 * time.Minute,
	})
}

// TestChaosLong is `make chaos`: the long form, with parameters from the
// environment (see Config.FromEnv) and Defaults for the rest.
func TestChaosLong(t *testing.T) {
	if os.Getenv("TOLLGATE_CHAOS_LONG") != "1" {
		t.Skip("set TOLLGATE_CHAOS_LONG=1 (make chaos) for the long chaos run")
	}
	runChaos(t, Defaults())
}

// TestChaosCluster is `make cluster-test`: the pipeline on a three-node
// JetStream cluster (every stream and bucket R3), one process per stage
// connected with all three URLs, and the node leading TOLLGATE_TURNS
// SIGKILLed under load and restarted some seconds later. One process per
// stage keeps it clear of the known session-order defect with several
// executor replicas (TestSessionOrderRepro), and no worker is killed, so a
// claim held by a dead worker (2-minute lease) does not stretch the run.
func TestChaosCluster(t *testing.T) {
	if os.Getenv("TOLLGATE_CHAOS_CLUSTER_TEST") != "1" {
		t.Skip("set TOLLGATE_CHAOS_CLUSTER_TEST=1 (make cluster-test) for the three-node cluster run")
	}
	runChaos(t, Config{
		Turns: 400, Kills: 0, BrokerRestarts: 1, LeaderPauses: 1, Partitions: 1, Replicas: 2, ClusterNodes: 3, Concurrency: 16, MaxSessionTurns: 4,
		// No tool service crash call: it would hold its session for the
		// 1-minute tool timeout (TestChaosShort has one).
		ExpiresAfter: time.Second, ToolCrashes: -1, FaultFrom: 0.3, FaultTo: 0.6,
		// No worker is killed, but a call whose tool ran just as the claims
		// bucket lost its leader cannot have its result recorded, and waits
		// out the 2-minute claim lease (then EXECUTION_UNCERTAIN).
		StallTimeout: 3 * time.Minute, MaxDuration: 10 * time.Minute,
	})
}

// TestMain removes the binaries the package's runs shared.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// shared holds the binaries built once for every run of this test binary
// that builds its own (about 15 s each time otherwise).
var shared struct {
	once sync.Once
	dir  string
	err  error
}

// sharedBinaries builds tollgate, the tool service and nats-server
// (without -race) once per test binary and returns their directory; with
// make test's prebuilt binaries (childproc.EnvBin) only the tool service
// is built.
func sharedBinaries(t *testing.T) string {
	t.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "tollgate-chaos-bin-*"); shared.err != nil {
			return
		}
		t0 := time.Now()
		if pre := os.Getenv(childproc.EnvBin); pre != "" {
			for _, b := range []string{"tollgate", "nats-server"} {
				if shared.err = os.Symlink(filepath.Join(pre, b), filepath.Join(shared.dir, b)); shared.err != nil {
					return
				}
			}
			// Only the tool service: childproc.Build would also link a
			// nats-server, which make build has.
			out, err := exec.Command("go", "build", "-o", shared.dir+string(filepath.Separator), "./"+ToolService).CombinedOutput()
			if err != nil {
				shared.err = fmt.Errorf("go build ./%s: %w\n%s", ToolService, err, out)
			}
		} else {
			shared.err = BuildBinaries(context.Background(), shared.dir, false)
		}
		t.Logf("built the shared binaries in %v", time.Since(t0).Round(time.Millisecond))
	})
	if shared.err != nil {
		t.Fatalf("build binaries: %v", shared.err)
	}
	return shared.dir
}

func runChaos(t *testing.T, cfg Config) {
	cfg, err := cfg.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Seed == 0 {
		// Drawn here, not by Run, so that the checks below read the plan
		// the run drove: each withDefaults of a zero seed draws another
		// from the clock, and the grant check once counted the planned
		// grant decisions of a different plan.
		cfg.Seed = cfg.withDefaults().Seed
	}
	if cfg.BinDir == "" && !cfg.RaceBinaries {
		cfg.BinDir = sharedBinaries(t)
	}
	cfg.WorkDir = t.TempDir()
	if dir := os.Getenv("TOLLGATE_CHAOS_DIR"); dir != "" {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if cfg.WorkDir, err = os.MkdirTemp(dir, "run-*"); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Logf = t.Logf
	r, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("chaos harness: %v (work dir %s)", err, cfg.WorkDir)
	}
	var b strings.Builder
	r.Print(&b)
	t.Log("\n" + b.String())
	n := r.Violations()
	if os.Getenv("TOLLGATE_CHAOS_ALLOW") == "session-order" && r.SessionOrder > 0 {
		// An explicit opt-out, for work unrelated to session order, from
		// failing on session-order violations; the violations are still
		// printed above.
		t.Logf("TOLLGATE_CHAOS_ALLOW=session-order: %d session-order violations do not fail this run", r.SessionOrder)
		n -= r.SessionOrder
	}
	if n > 0 {
		t.Errorf("%d violations; logs and ledger in %s (set TOLLGATE_CHAOS_DIR to keep them); replay: %s", n, cfg.WorkDir, r.Replay)
	}
	if r.Kills+r.BrokerRestarts == 0 && cfg.Kills+cfg.BrokerRestarts > 0 {
		t.Errorf("no fault was injected")
	}
	// Each planned write kill's turn makes at least the writes its
	// position counts, so each fires (a turn the drive never sent is
	// reported as a lost or unsent turn already).
	fired := 0
	for _, w := range r.WriteKills {
		if w.Fired && w.Killed > 0 {
			fired++
		}
	}
	if planned := len(NewPlan(cfg.withDefaults()).WriteKills); fired < planned || len(r.WriteKills) != planned {
		t.Errorf("%d of %d planned write kills fired (%d reported)", fired, planned, len(r.WriteKills))
	}
	if r.Executions == 0 || r.ApprovalsBy["approved"] == 0 || r.ApprovalsBy["denied"] == 0 {
		t.Errorf("the run exercised too little: %d executions, approvals %v", r.Executions, r.ApprovalsBy)
	}
	granted := 0
	for _, tp := range NewPlan(cfg.withDefaults()).Turns {
		for _, c := range tp.Calls {
			if c.Decision == DecideGrant {
				granted++
			}
		}
	}
	// A planned grant decision must make grants. Whether a later call of the
	// same session then falls inside one depends on the seed (a short run,
	// a planner turn's model choosing other tools), so approvals decided by
	// a grant are reported, not required here; pipeline/grants tests that
	// a grant decides a covered call, and `make chaos` runs long enough to
	// show it (53 in the last note's run).
	if granted > 0 && r.GrantsMade == 0 {
		t.Errorf("%d grant decisions planned, but no grant was made", granted)
	}
	if r.RemoteExecutions == 0 {
		t.Errorf("the remote tool service ran no call")
	}
	if cfg.ToolCrashes > 0 && (r.LostReplies == 0 || r.ToolCrashes == 0) {
		t.Errorf("no remote call lost its reply: %d lost replies, %d tool service crashes", r.LostReplies, r.ToolCrashes)
	}
	if cfg.Planner && (r.PlannerStates["completed"] == 0 || r.StepBatches == 0 || r.Replies == 0) {
		t.Errorf("the planner turns exercised too little: planner turns %v, %d step batches, %d replies", r.PlannerStates, r.StepBatches, r.Replies)
	}
	if workers := cfg.workers(); cfg.Kills >= len(workers) {
		for _, w := range workers {
			if r.KillsOf[w] == 0 {
				t.Errorf("no %s process was killed (kills %v)", w, r.KillsOf)
			}
		}
	}
}

// TestSessionOrderRepro is the minimal reproduction of the session-order
// violation the chaos runs used to find: no fault at all, two replicas of
// each stage, and each session's turns published back to back. Two executor
// processes take two accepted turns of one session from the shared durable
// consumer at the same time, and without the executor's arrival-order check
// the later one could acquire the session first; with two ingest processes
// the accepted turns can also be published out of arrival order. The check
// (pipeline/sessionorder, docs/protocol.md §11) prevents both; this
// test fails if it stops doing so.
func TestSessionOrderRepro(t *testing.T) {
	if testing.Short() {
		t.Skip("process test skipped with -short")
	}
	runChaos(t, Config{
		Seed: 7, Turns: 120, Kills: 0, BrokerRestarts: 0, Replicas: 2, Concurrency: 16,
		MaxSessionTurns: 4, BurstPercent: 100, ExpiresAfter: time.Second, ToolCrashes: -1,
		StallTimeout: time.Minute, MaxDuration: 3 * time.Minute,
	})
}

// The same seed gives the same turn mix and fault schedule.
func TestPlanIsAFunctionOfTheSeed(t *testing.T) {
	c := Defaults()
	c.Seed, c.Turns = 42, 500
	c0 := c
	a, b := NewPlan(c), NewPlan(c)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two plans of one seed differ")
	}
	c.Seed = 43
	if reflect.DeepEqual(a, NewPlan(c)) {
		t.Fatal("plans of two seeds are equal")
	}
	if len(a.Turns) != 500 || len(a.Faults) != c.Kills+c.BrokerRestarts {
		t.Fatalf("%d turns, %d faults", len(a.Turns), len(a.Faults))
	}
	// The write kills come from a random source of their own (a seed's
	// turns and other faults are those it had before them), and they go
	// round every position of both paths, each on a turn of its path of
	// its own.
	c2 := c0
	c2.WriteKills = 0
	if p := NewPlan(c2); !reflect.DeepEqual(p.Turns, a.Turns) || !reflect.DeepEqual(p.Faults, a.Faults) || len(p.WriteKills) != 0 {
		t.Fatal("the write kills changed the seed's turns or faults")
	}
	positions, targets := map[string]bool{}, map[int]bool{}
	for _, w := range a.WriteKills {
		tp := a.Turns[w.Turn]
		if tp.Kind != w.Path || targets[w.Turn] || w.K < 1 || w.K > writeKillWrites[w.Path] || w.Down <= 0 {
			t.Errorf("write kill %v of a %s turn (again: %v)", w, tp.Kind, targets[w.Turn])
		}
		positions[fmt.Sprintf("%s %d", w.Path, w.K)], targets[w.Turn] = true, true
	}
	if want := writeKillWrites[writeKillPlain] + writeKillWrites[writeKillSingle]; c0.WriteKills != want || len(positions) != want {
		t.Errorf("%d write kills planned at %d positions, want every one of the %d", len(a.WriteKills), len(positions), want)
	}
	kinds := map[string]int{}
	tools, crashes := map[string]int{}, 0
	for _, tp := range a.Turns {
		kinds[tp.Kind]++
		for _, c := range tp.Calls {
			tools[c.Tool]++
			if c.Crash {
				crashes++
				if c.Tool != toolsvc.Ledger || tp.Index < int(c0.FaultTo*float64(c0.Turns)) {
					t.Errorf("crash call of %s in turn %d", c.Tool, tp.Index)
				}
			}
		}
	}
	grantDecisions, revokes := 0, 0
	for _, tp := range a.Turns {
		if tp.Revoke {
			revokes++
		}
		for _, c := range tp.Calls {
			if c.Decision == DecideGrant {
				grantDecisions++
			}
		}
	}
	if grantDecisions == 0 || revokes == 0 {
		t.Errorf("%d grant decisions and %d turns that revoke in 500 turns", grantDecisions, revokes)
	}
	for _, k := range []string{"plain", "single", "multi", "dup", "conflict", "expiry"} {
		if kinds[k] == 0 {
			t.Errorf("no %s turn in 500", k)
		}
	}
	for _, tool := range []string{toolsvc.Ledger, toolsvc.LedgerGuarded} {
		if tools[tool] == 0 {
			t.Errorf("no call of the remote %s in 500 turns", tool)
		}
	}
	if crashes != c0.ToolCrashes {
		t.Errorf("%d crash calls, want %d", crashes, c0.ToolCrashes)
	}
	killed := map[string]int{}
	for _, f := range a.Faults {
		if !f.Broker {
			killed[f.Stage]++
		}
	}
	for _, w := range Workers {
		if killed[w] != c0.Kills/len(Workers) {
			t.Errorf("%d kills of %s, want %d (kills go round the workers)", killed[w], w, c0.Kills/len(Workers))
		}
	}
}

// Leader pauses and partitions are planned in a cluster only, as broker faults that kill
// nothing, longer than an election, from a random source of their own: a
// seed's turns and other faults are those it had without them.
func TestLeaderPausesArePlannedInAClusterOnly(t *testing.T) {
	c := Defaults()
	c.Seed, c.Turns, c.ClusterNodes, c.LeaderPauses, c.Partitions = 42, 400, 3, 2, 1
	c = c.withDefaults()
	a := NewPlan(c)
	var pauses, cuts []Fault
	for _, f := range a.Faults {
		if f.Pause || f.Partition {
			if f.Pause {
				pauses = append(pauses, f)
			} else {
				cuts = append(cuts, f)
			}
			if !f.Broker || !f.Leader || f.Down < 10*time.Second {
				t.Errorf("%v: want a broker fault on a leader, longer than an election", f)
			}
		}
	}
	if len(pauses) != 2 || len(cuts) != 1 {
		t.Fatalf("%d pauses and %d partitions planned, want 2 and 1", len(pauses), len(cuts))
	}
	c1 := c
	c1.LeaderPauses, c1.Partitions = 0, 0
	others := slices.DeleteFunc(slices.Clone(a.Faults), func(f Fault) bool { return f.Pause || f.Partition })
	if p := NewPlan(c1); !reflect.DeepEqual(p.Turns, a.Turns) || !reflect.DeepEqual(p.Faults, others) {
		t.Fatal("the pauses changed the seed's turns or other faults")
	}
	one := Defaults()
	one.LeaderPauses, one.Partitions = 2, 1
	if one = one.withDefaults(); one.LeaderPauses != 0 || one.Partitions != 0 {
		t.Errorf("one server: %d leader pauses and %d partitions kept, want none (there is no other node)", one.LeaderPauses, one.Partitions)
	}
}

// In planner mode about PlannerPercent of the turns are planner turns
// (text only: no calls, a script of tool steps, gated calls among them),
// the planner processes are among the workers killed, and KillOnly
// narrows the kills to the workers it names.
func TestPlannerPlan(t *testing.T) {
	c := Defaults()
	c.Seed, c.Turns, c.Planner = 42, 1000, true
	c = c.withDefaults()
	p := NewPlan(c)
	planned, steps, gated := 0, 0, 0
	for _, tp := range p.Turns {
		if !tp.Planner() {
			continue
		}
		planned++
		if len(tp.Calls) > 0 {
			t.Errorf("planner turn %d has calls %v", tp.Index, tp.Calls)
		}
		for _, calls := range tp.Steps {
			steps++
			for _, call := range calls {
				if call.NeedsApproval() {
					gated++
				}
			}
		}
	}
	if planned < 250 || planned > 350 || steps == 0 || gated == 0 {
		t.Errorf("%d planner turns in 1000 (want about 300), %d tool steps, %d gated calls", planned, steps, gated)
	}
	killed := map[string]int{}
	for _, f := range p.Faults {
		killed[f.Stage]++
	}
	if killed[PlannerStage] == 0 || killed["executor"] == 0 {
		t.Errorf("kills %v: want the planner among every worker", killed)
	}
	c.KillOnly = []string{PlannerStage}
	for _, f := range NewPlan(c).Faults {
		if !f.Broker && f.Stage != PlannerStage {
			t.Errorf("KillOnly planner: a kill of %s", f.Stage)
		}
	}
}

func TestPolicyLoads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(path, []byte(Policy(time.Second)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Load(path); err != nil {
		t.Fatal(err)
	}
}

// A cluster node's configuration is what nats-server reads as one: the
// cluster, its routes, JetStream with sync_interval: always.
func TestClusterNodeConfig(t *testing.T) {
	dir := t.TempDir()
	nd := &node{name: "tollgate-chaos-2", port: 14222, clusterPort: 16223, conf: filepath.Join(dir, "nats-2.conf")}
	routes := []string{"nats-route://127.0.0.1:16222", "nats-route://127.0.0.1:16223", "nats-route://127.0.0.1:16224"}
	if err := writeBrokerConfig(nd, routes, filepath.Join(dir, "js")); err != nil {
		t.Fatal(err)
	}
	o, err := server.ProcessConfigFile(nd.conf)
	if err != nil {
		t.Fatal(err)
	}
	if o.ServerName != nd.name || o.Port != nd.port || o.Cluster.Name != clusterName || o.Cluster.Port != nd.clusterPort || len(o.Routes) != 3 || !o.JetStream || !o.SyncAlways {
		t.Fatalf("parsed %+v", o)
	}
}
