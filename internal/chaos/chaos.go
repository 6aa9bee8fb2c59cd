package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// harness is one run: its processes, files and schedule.
type harness struct {
	cfg  Config
	plan Plan

	dir, logDir, binDir, toolBin        string
	policyPath, ledgerPath, sealKeyPath string
	url                                 string
	// model is the scripted model of the planner turns (planner mode).
	model    *plannertest.Server
	modelURL string

	nodes  []*node // the nats-server, or the nodes of the cluster
	stages map[string][]*slot

	mu         sync.Mutex
	procs      []*childproc.Proc
	lastFault  time.Time
	kills      int
	killsOf    map[string]int // kills by binary
	restarts   int
	pauses     int // leader pauses (SIGSTOP, then SIGCONT)
	partitions int // nodes cut off from their peers, then healed
	// routeProxies carry every route of a cluster (partition.go).
	routeProxies []*routeProxy
	skipped      int
	clusterNotes []string
}

func (h *harness) logf(format string, args ...any) {
	h.cfg.Logf("chaos %s "+format, append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func (h *harness) debugf(format string, args ...any) {
	if os.Getenv("TOLLGATE_CHAOS_DEBUG") == "1" {
		h.logf(format, args...)
	}
}

func (h *harness) addProc(p *childproc.Proc) {
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
}

// Policy is the harness's tool policy: one tool per treatment, and the
// remote tool service's two tools treated like ledger and ledger_guarded.
// ledger_guarded (in process) offers a session grant (GrantOption).
func Policy(expiresAfter time.Duration) string {
	return fmt.Sprintf(`{
  "version": "chaos-1",
  "default_approval": "deny",
  "tools": {
    %q: {"approval": "never"},
    %q: {"approval": "required", "grants": [{"option": %q, "scope": "session", "for": "30m"}]},
    %q: {"approval": "required", "expires_after": %q},
    %q: {"approval": "deny"},
    %q: {"approval": "never"},
    %q: {"approval": "required"}
  },
  "transports": {%q: {"trust_boundary": "local", "interactive": true}}
}
`, tools.LedgerTool, tools.LedgerGuardedTool, GrantOption, tools.LedgerExpiringTool, expiresAfter.String(), tools.LedgerDeniedTool,
		toolsvc.Ledger, toolsvc.LedgerGuarded, transport)
}

// Run performs one chaos run in cfg.WorkDir and returns its report. An error
// means the harness could not do its job (set-up, broker gone); violations
// are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	start := time.Now()
	cfg = cfg.withDefaults()
	if cfg.WorkDir == "" {
		return nil, errors.New("chaos: WorkDir is required")
	}
	h := &harness{cfg: cfg, plan: NewPlan(cfg), dir: cfg.WorkDir, stages: map[string][]*slot{}, killsOf: map[string]int{}}
	h.logf("parameters: %s", cfg.Params())
	h.logf("replay with: %s", cfg.Replay())
	h.logf("work dir: %s", h.dir)
	defer h.stopAll()
	if cfg.Planner {
		m, err := startModel(h.plan)
		if err != nil {
			return nil, err
		}
		defer m.Close()
		h.model, h.modelURL = m, m.URL
	}
	if err := h.setUp(ctx); err != nil {
		return nil, err
	}

	nc, err := nats.Connect(h.url, nats.Name("tollgate-chaos"), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0), nats.ReconnectBufSize(64<<20))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", h.url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if err := h.waitJetStream(ctx, js); err != nil {
		return nil, err
	}
	if err := h.startStages(ctx); err != nil {
		return nil, err
	}
	buckets, err := topology.OpenBuckets(ctx, js)
	if err != nil {
		return nil, err
	}
	d := newDriver(h, js, store.New(buckets))

	driveCtx, stopDrive := context.WithTimeout(ctx, cfg.MaxDuration)
	defer stopDrive()
	stopFollow, err := d.follow(driveCtx)
	if err != nil {
		return nil, err
	}
	go d.sweep(driveCtx)
	faultsDone := make(chan struct{})
	d.faultsDone = faultsDone
	go func() {
		defer close(faultsDone)
		h.injectFaults(driveCtx, d)
		for _, ss := range h.stages { // the last killed are restarted
			for _, s := range ss {
				_, _ = s.waitUp(driveCtx)
			}
		}
	}()
	stopWriteKills, err := h.armWriteKills(driveCtx, nc, d)
	if err != nil {
		return nil, err
	}
	go h.watchProgress(driveCtx, d, stopDrive)

	h.logf("driving %d turns in %d sessions, %d at a time; %d faults scheduled", len(h.plan.Turns), len(h.plan.Sessions), cfg.Concurrency, len(h.plan.Faults))
	driveErr := h.drive(driveCtx, d)
	<-faultsDone
	published, terminal, _, lastTerminal := d.counts()
	h.logf("drive ended (%v): %d published, %d terminal", driveErr, published, terminal)
	stopFollow()
	writeKills := stopWriteKills()
	stopDrive()
	d.decisions.Wait()

	// Stop the workers first, so that the ledger and KV no longer change
	// while they are read; the broker stays up for the reads.
	h.stopStages()
	h.checkReplicas(ctx, js)
	f, err := h.gather(ctx, js, d)
	if err != nil {
		return nil, err
	}
	r := Check(f)
	r.Params, r.Replay = cfg.Params(), cfg.Replay()
	h.mu.Lock()
	r.Kills, r.BrokerRestarts, r.FaultsSkipped, r.LastFault = h.kills, h.restarts, h.skipped, h.lastFault
	r.LeaderPauses, r.Partitions = h.pauses, h.partitions
	r.KillsOf = maps.Clone(h.killsOf)
	r.WriteKills = writeKills
	for _, n := range h.clusterNotes {
		r.note("cluster", "%s", n)
	}
	for id, sent := range d.unended() {
		r.note("decisions sent for a turn not seen ending", "%s: %s", id, strings.Join(sent, "; "))
	}
	h.mu.Unlock()
	r.ClusterNodes = cfg.ClusterNodes
	if r.Lost == 0 && r.NotSent == 0 {
		r.AllTerminal = lastTerminal
	}
	for _, ss := range h.stages {
		for _, s := range ss {
			for _, e := range s.unexpectedExits() {
				r.UnexpectedExits++
				r.note("unexpected worker exit (restarted)", "%s", e)
			}
			r.ToolCrashes += s.plannedCrashes()
		}
	}
	r.Wall = time.Since(start)
	return r, nil
}

// setUp writes the files, builds or finds the binaries and starts the
// broker (or the cluster).
func (h *harness) setUp(ctx context.Context) error {
	h.logDir = filepath.Join(h.dir, "logs")
	h.policyPath = filepath.Join(h.dir, "policy.json")
	h.ledgerPath = filepath.Join(h.dir, "ledger.jsonl")
	h.sealKeyPath = filepath.Join(h.dir, "seal-keys.json")
	if err := os.MkdirAll(h.logDir, 0o750); err != nil {
		return err
	}
	if err := os.WriteFile(h.policyPath, []byte(Policy(h.cfg.ExpiresAfter)), 0o600); err != nil {
		return err
	}
	if err := writeSealKey(h.sealKeyPath); err != nil {
		return err
	}
	h.binDir = h.cfg.BinDir
	h.toolBin = filepath.Join(h.binDir, ToolService)
	if h.binDir == "" {
		h.binDir = filepath.Join(h.dir, "bin")
		h.toolBin = filepath.Join(h.binDir, ToolService)
		t0 := time.Now()
		if err := BuildBinaries(ctx, h.binDir, h.cfg.RaceBinaries); err != nil {
			return err
		}
		h.logf("built binaries in %v", time.Since(t0).Round(time.Millisecond))
	} else if _, err := os.Stat(h.toolBin); err != nil {
		// Prebuilt binaries (make chaos: ./bin) do not include the
		// harness's own tool service.
		dir := filepath.Join(h.dir, "bin")
		if err := childproc.Build(ctx, dir, h.cfg.RaceBinaries, toolServicePkg); err != nil {
			return err
		}
		h.toolBin = filepath.Join(dir, ToolService)
	}
	for _, b := range append([]string{"nats-server", ToolService}, h.cfg.stages()...) {
		if _, err := os.Stat(h.binPath(b)); err != nil {
			return fmt.Errorf("binary %s: %w", b, err)
		}
	}

	return h.startBrokers(ctx)
}

// startStages starts every replica of the tool service and waits until
// each serves (so that the executors and redrivers find its tools at
// start), then every stage replica and waits until each consumes.
func (h *harness) startStages(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	n := 0
	for _, group := range []struct {
		bins  []string
		ready string
	}{{[]string{ToolService}, `msg="tool service serving"`}, {h.cfg.stages(), `msg="stage consuming"`}} {
		var first []*childproc.Proc
		var all []*slot
		for _, bin := range group.bins {
			for r := 1; r <= h.cfg.Replicas; r++ {
				s := newSlot(h, fmt.Sprintf("%s-%d", bin, r), bin)
				p, err := s.start()
				if err != nil {
					return err
				}
				h.stages[bin] = append(h.stages[bin], s)
				all, first = append(all, s), append(first, p)
			}
		}
		for i, p := range first {
			if err := waitLog(wctx, p, group.ready); err != nil {
				return err
			}
			go all[i].supervise(p)
		}
		n += len(first)
	}
	h.logf("%d processes serving and consuming (%d per stage and of the tool service)", n, h.cfg.Replicas)
	return nil
}

// drive runs the sessions, Concurrency at a time, until all are done or ctx
// ends.
func (h *harness) drive(ctx context.Context, d *driver) error {
	next := make(chan []int)
	errs := make(chan error, h.cfg.Concurrency)
	var wg sync.WaitGroup
	for range h.cfg.Concurrency {
		wg.Go(func() {
			for s := range next {
				if err := d.runSession(ctx, s); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for _, s := range h.plan.Sessions {
		select {
		case next <- s:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// watchProgress ends the drive when no turn has been published or ended for
// StallTimeout, or logs progress every 10 seconds.
func (h *harness) watchProgress(ctx context.Context, d *driver, stop func()) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastLog := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		published, terminal, last, _ := d.counts()
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			h.logf("progress: %d/%d published, %d terminal", published, len(d.turns), terminal)
		}
		if time.Since(last) > h.cfg.StallTimeout {
			h.logf("no progress for %v: ending the drive", h.cfg.StallTimeout)
			stop()
			return
		}
	}
}

// injectFaults performs the planned faults, each once enough turns have been
// published, until the drive ends.
func (h *harness) injectFaults(ctx context.Context, d *driver) {
	for i, f := range h.plan.Faults {
		for {
			published, _, _, _ := d.counts()
			if published >= f.AtTurn {
				break
			}
			select {
			case <-ctx.Done():
				h.mu.Lock()
				h.skipped = len(h.plan.Faults) - i
				h.mu.Unlock()
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		time.Sleep(f.Jitter)
		h.logf("fault %d/%d: %s", i+1, len(h.plan.Faults), f)
		var err error
		switch {
		case f.Partition:
			err = h.partitionNode(ctx, d.js, f.Down)
		case f.Pause:
			err = h.pauseLeader(ctx, d.js, f.Down)
		case f.Broker:
			err = h.restartBroker(ctx, d.js, f.Down)
		default:
			err = h.killWorker(ctx, h.stages[f.Stage][f.Replica-1], f.Down)
		}
		if err != nil {
			h.logf("fault %d (%s): %v", i+1, f, err)
		}
	}
}

// killWorker SIGKILLs a stage or tool service process; its supervisor
// restarts it after down.
func (h *harness) killWorker(ctx context.Context, s *slot, down time.Duration) error {
	if _, err := s.waitUp(ctx); err != nil {
		return err
	}
	h.countKills(s.bin, 1)
	return s.kill(ctx, down)
}

// countKills records n SIGKILLs of processes of binary bin, now.
func (h *harness) countKills(bin string, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.kills += n
	h.killsOf[bin] += n
	h.lastFault = time.Now()
}

// stopStages ends every stage process (SIGTERM: they drain), then the tool
// service, which the draining stages may still call.
func (h *harness) stopStages() {
	for _, toolService := range []bool{false, true} {
		var wg sync.WaitGroup
		for bin, ss := range h.stages {
			if (bin == ToolService) != toolService {
				continue
			}
			for _, s := range ss {
				wg.Go(func() { s.stop(15 * time.Second) })
			}
		}
		wg.Wait()
	}
}

func (h *harness) stopAll() {
	h.stopStages()
	for _, n := range h.nodes {
		n.slot.stop(10 * time.Second)
	}
	for _, p := range h.routeProxies {
		p.close()
	}
}

// gather reads the facts: the planned turns with their batch and approval
// records, every stored outcome, the ledger, dead letters and process logs.
func (h *harness) gather(ctx context.Context, js jetstream.JetStream, d *driver) (*Facts, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	f := &Facts{Outcomes: map[string][]*schemas.TurnOutcome{}}
	d.mu.Lock()
	f.Rejections = maps.Clone(d.rejections)
	d.mu.Unlock()
	for _, t := range d.turns {
		d.mu.Lock()
		tf := TurnFact{Plan: *t.plan, ID: t.id, SessionID: t.sessionID, Principal: schemas.Principal(transport, t.sender), Published: t.published, Seq: t.seq}
		d.mu.Unlock()
		if tf.Published {
			b, err := read(ctx, "batch "+t.id, func() (*schemas.BatchRecord, uint64, error) { return d.st.Batches.Get(ctx, t.id) })
			if err != nil {
				return nil, err
			}
			tf.Batch = b
			tf.Approvals = make([]*schemas.ApprovalRecord, len(t.plan.Calls))
			for i := range t.plan.Calls {
				id := schemas.ApprovalID(t.id, i)
				if tf.Approvals[i], err = read(ctx, "approval "+id, func() (*schemas.ApprovalRecord, uint64, error) { return d.st.Approvals.Get(ctx, id) }); err != nil {
					return nil, err
				}
			}
		}
		f.Turns = append(f.Turns, tf)
	}
	if h.cfg.Planner {
		if err := h.gatherPlanner(ctx, js, d, f); err != nil {
			return nil, err
		}
	}
	// Reads are tried again on errors a cluster shows while it settles
	// after a node's restart (topology.Retry).
	err := topology.Retry(ctx, func() error {
		var err error
		f.Outcomes, err = outcomes.Stored(ctx, js)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the outcomes: %w", err)
	}
	err = topology.Retry(ctx, func() error {
		gs, err := grants.List(ctx, d.st, func(key string, err error) { h.logf("undecodable grant record %s: %v", key, err) })
		f.Grants = map[string]*schemas.Grant{}
		for _, g := range gs {
			f.Grants[g.GrantID] = g
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read the grants: %w", err)
	}
	err = topology.Retry(ctx, func() error {
		s, err := js.Stream(ctx, topology.StreamDLQ)
		if err == nil {
			f.DeadLetters = s.CachedInfo().State.Msgs
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", topology.StreamDLQ, err)
	}
	if f.Ledger, f.BadLedger, err = readLedger(h.ledgerPath); err != nil {
		return nil, err
	}
	h.mu.Lock()
	procs := append([]*childproc.Proc(nil), h.procs...)
	h.mu.Unlock()
	for _, p := range procs {
		text := p.LogText()
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:", `msg="handler panic"`, `msg="tool panic"`} {
			if strings.Contains(text, bad) {
				f.ProcessLogs = append(f.ProcessLogs, fmt.Sprintf("%s: %q in %s", p.Name, bad, p.Log))
			}
		}
	}
	return f, nil
}

// read gets one record for gather: nil if there is none, tried again on
// transient errors.
func read[T any](ctx context.Context, what string, get func() (*T, uint64, error)) (*T, error) {
	var rec *T
	err := topology.Retry(ctx, func() (err error) {
		rec, _, err = get()
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return rec, nil
}

// readLedger parses the ledger file (absent: no executions).
func readLedger(path string) ([]toolsvc.Execution, []string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	var es []toolsvc.Execution
	var bad []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e toolsvc.Execution
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.CallID == "" {
			bad = append(bad, sc.Text())
			continue
		}
		es = append(es, e)
	}
	return es, bad, sc.Err()
}
