package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/seal"
)

// Modes of running Tollgate.
const (
	modeAllInOne  = "all-in-one"
	modeProcesses = "processes"
)

// bencher runs the measurements of one bench run.
type bencher struct {
	cfg  Config
	keys *seal.KeyRing
	seqs map[path][]step // raw sequences, calibrated
	runs atomic.Int64
}

func (b *bencher) runID() string { return "r" + strconv.FormatInt(b.runs.Add(1), 10) }

// sample is one throughput measurement.
type sample struct {
	Rate     float64 `json:"rate"`
	Count    int     `json:"count"` // messages or turns inside the window
	Timeouts int     `json:"timeouts,omitempty"`
	Errors   int64   `json:"errors,omitempty"`
	// All-in-one only, for the whole process (stages, embedded server,
	// driver), inside the window.
	AllocsPerTurn float64 `json:"allocs_per_turn,omitempty"`
	BytesPerTurn  float64 `json:"bytes_per_turn,omitempty"`
	// Approval path, all-in-one: deferred redrive evaluations per started
	// batch, and the redriver's NAKs (a decided event that came before its
	// batch's awaiting append waits for it) per started batch.
	DeferredPerTurn float64 `json:"deferred_per_turn,omitempty"`
	EarlyPerTurn    float64 `json:"early_per_turn,omitempty"`
	// CPU time per completed turn in the window, in milliseconds: this
	// process (raw and all-in-one: everything; processes: the embedded
	// nats-server and the driver), and the stage processes together.
	CPUPerTurn       float64 `json:"cpu_ms_per_turn"`
	StagesCPUPerTurn float64 `json:"stages_cpu_ms_per_turn,omitempty"`
	// Planner path, all-in-one: the mean time of one model request as the
	// planner timed it (tollgate_planner_model_seconds), in the window.
	ModelMsPerCall float64 `json:"model_ms_per_call,omitempty"`
	// DiskFlushesPerTurn is the flush requests completed by the disk that
	// holds the server's store, per completed turn, inside the window
	// (diskFlushes; 0 where the disk does not report them). Under
	// sync_interval: always it is the turn's fsyncs as the disk saw them.
	DiskFlushesPerTurn float64 `json:"disk_flushes_per_turn,omitempty"`
	// WritesPerTurn is the messages stored in every stream (stream
	// publishes and KV writes) per completed turn, inside the window.
	WritesPerTurn float64 `json:"writes_per_turn,omitempty"`
	// Closed loop of a path with an approval: the median time from the
	// inbound message's publish to its approval seen requested (ingest and
	// the executor), and from the decision's publish to the outcome (the
	// approver and the redriver), in milliseconds. Where a closed loop's
	// turns wait (a queue in front of a stage, or of the disk) shows in
	// which half grows.
	ToPendingMs         float64 `json:"to_pending_p50_ms,omitempty"`
	DecisionToOutcomeMs float64 `json:"decision_to_outcome_p50_ms,omitempty"`
	// Raw turn: compare-and-set conflicts between raw stages.
	Conflicts int64 `json:"conflicts,omitempty"`
	// All-in-one: messages the stages NAKed for a retry, and dead letters,
	// inside the window. Raw turn: messages its stages NAKed for a retry
	// (the redriver's early decided events), in the whole run.
	Retries     float64 `json:"retries,omitempty"`
	DeadLetters float64 `json:"dead_letters,omitempty"`
	// turns are the closed loop's turn times inside the window.
	turns []turnTimes
}

// envConn starts a fresh server with a client connection on it; done
// closes both.
func (b *bencher) envConn(st storage, name string) (*env, jetstream.JetStream, func(), error) {
	e, err := b.startEnv(st)
	if err != nil {
		return nil, nil, nil, err
	}
	nc, js, err := e.connect(name)
	if err != nil {
		e.close()
		return nil, nil, nil, err
	}
	return e, js, func() { nc.Close(); e.close() }, nil
}

// rawStreamConfig is a stream configured like Tollgate's streams on st.
func rawStreamConfig(st storage, name, subjects string) jetstream.StreamConfig {
	sc := st.topology().Streams()[0]
	sc.Name, sc.Subjects, sc.Description = name, []string{subjects}, "bench reference"
	return sc
}

// rawPublish measures JetStream async publish: messages the size of an
// approval-path inbound message, each with a message id (as a transport
// publishes), into a file stream configured like Tollgate's, with a window
// of asyncWindow unacknowledged publishes. The rate counts messages stored
// during the window.
func (b *bencher) rawPublish(st storage) (sample, error) {
	_, js, done, err := b.envConn(st, "bench-raw-publish")
	if err != nil {
		return sample{}, err
	}
	defer done()
	ctx := context.Background()
	s, err := js.CreateStream(ctx, rawStreamConfig(st, "BENCH_PUB", "bench.pub.>"))
	if err != nil {
		return sample{}, err
	}
	payload := make([]byte, b.seqs[approvalPath][0].Bytes)
	stored := func() uint64 {
		info, err := s.Info(ctx)
		if err != nil {
			return 0
		}
		return info.State.Msgs
	}
	var errs atomic.Int64
	stop := make(chan struct{})
	stopped := make(chan struct{})
	id := b.runID()
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, err := js.PublishMsgAsync(&nats.Msg{Subject: "bench.pub.x", Data: payload}, jetstream.WithMsgID(id+"-"+strconv.Itoa(i)))
			if err != nil && !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				errs.Add(1)
			}
		}
	}()
	time.Sleep(b.cfg.Warmup)
	n0, t0 := stored(), time.Now()
	time.Sleep(b.cfg.Duration)
	n1, t1 := stored(), time.Now()
	close(stop)
	<-stopped
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
	}
	return sample{Rate: float64(n1-n0) / t1.Sub(t0).Seconds(), Count: int(n1 - n0), Errors: errs.Load()}, nil
}

// rawConsume measures a durable pull consumer configured like a stage's
// (explicit ack, pulls of 256) reading a prefilled file stream and acking
// each message. The stream is prefilled with up to ConsumeMsgs messages the
// size of an approval-path accepted turn (at most 15s of publishing).
func (b *bencher) rawConsume(st storage) (sample, error) {
	_, js, done, err := b.envConn(st, "bench-raw-consume")
	if err != nil {
		return sample{}, err
	}
	defer done()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, rawStreamConfig(st, "BENCH_CON", "bench.con.>")); err != nil {
		return sample{}, err
	}
	payload := make([]byte, b.seqs[approvalPath][1].Bytes)
	deadline := time.Now().Add(15 * time.Second)
	n := 0
	for ; n < b.cfg.ConsumeMsgs && time.Now().Before(deadline); n++ {
		for {
			_, err := js.PublishMsgAsync(&nats.Msg{Subject: "bench.con.x", Data: payload})
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return sample{}, err
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return sample{}, fmt.Errorf("prefill not acknowledged")
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "BENCH_CON", jetstream.ConsumerConfig{
		Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1, MaxAckPending: 1024,
	})
	if err != nil {
		return sample{}, err
	}
	var got atomic.Int64
	var errs atomic.Int64
	all := make(chan time.Time, 1)
	t0 := time.Now()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := m.Ack(); err != nil {
			errs.Add(1)
		}
		if got.Add(1) == int64(n) {
			all <- time.Now()
		}
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		return sample{}, err
	}
	defer cc.Stop()
	select {
	case t1 := <-all:
		return sample{Rate: float64(n) / t1.Sub(t0).Seconds(), Count: n, Errors: errs.Load()}, nil
	case <-time.After(2 * time.Minute):
		return sample{}, fmt.Errorf("consumed %d of %d in 2m", got.Load(), n)
	}
}

// rawTurn measures the raw turn of p: the raw stages on one connection, the
// driver on another, in a closed loop at the configured concurrency.
func (b *bencher) rawTurn(p path, st storage) (sample, error) {
	e, js, done, err := b.envConn(st, "bench-raw-stages")
	if err != nil {
		return sample{}, err
	}
	defer done()
	r, err := startRawStages(js, b.seqs[p], p)
	if err != nil {
		return sample{}, err
	}
	defer r.close()
	s, err := b.drive(e, p, true, nil, nil)
	s.Errors += r.errs.Load()
	s.Conflicts = r.conflicts.Load()
	s.Retries = float64(r.retries.Load())
	if v := r.lastErr.Load(); v != nil {
		b.cfg.Logf("bench: raw %s turn: %d errors, last: %v", p, r.errs.Load(), v)
	}
	return s, err
}

// rawTurnProcs measures the raw turn of p with each raw stage in a process
// of its own (this program's executable, see MaybeRunRawStage): the
// reference for Tollgate's stages as separate processes.
func (b *bencher) rawTurnProcs(p path, st storage) (sample, error) {
	e, err := b.startEnv(st)
	if err != nil {
		return sample{}, err
	}
	defer e.close()
	self, err := os.Executable()
	if err != nil {
		return sample{}, err
	}
	data, err := json.Marshal(rawSeqFile{Path: p.String(), Steps: b.seqs[p]})
	if err != nil {
		return sample{}, err
	}
	seqFile := filepath.Join(e.dir, "raw-seq.json")
	if err := os.WriteFile(seqFile, data, 0o600); err != nil {
		return sample{}, err
	}
	ps, err := launch(&procSet{e: e, consumer: rawStageConfigs.consumer, command: func(stage string) *exec.Cmd {
		cmd := exec.Command(self)
		cmd.Env = append(childproc.Env(), envRawStage+"="+stage, envRawURL+"="+e.url, envRawSeq+"="+seqFile)
		return cmd
	}})
	if err != nil {
		return sample{}, err
	}
	s, err := b.drive(e, p, true, ps.pids(), nil)
	ps.stop()
	var logs []string
	for _, st := range stageNames {
		logs = append(logs, filepath.Join(e.dir, st+".log"))
	}
	errs, conflicts, retries, last := rawResults(logs)
	s.Errors += errs
	s.Conflicts, s.Retries = conflicts, float64(retries)
	if errs > 0 {
		b.cfg.Logf("bench: raw %s turn (processes): %d errors, last: %s", p, errs, last)
	}
	return s, err
}

// drive runs the closed loop of p on e and returns its sample: turns
// sent by the driver over NATS (decided by its decider where p needs it),
// or for gatewayPath submitted and decided over the HTTP gateway, started
// here on e. onWindow is passed to closedLoop. The CPU time this process
// (and the processes pids, if any) used in the window is reported per
// completed turn. A turn that failed (other than by timing out) fails the
// sample. facts, if any, are where the turns' outcomes and approval
// requests are made durable besides today's events (driver.watchFacts).
func (b *bencher) drive(e *env, p path, raw bool, pids []int, onWindow func(open bool), facts ...string) (sample, error) {
	run := b.runID()
	var one func(ctx context.Context, session string) (turnTimes, error)
	pubErrs := func() int64 { return 0 }
	if p == gatewayPath {
		g, err := startGateway(e, b.cfg.Concurrency, b.cfg.LogLevel)
		if err != nil {
			return sample{}, err
		}
		defer g.stop()
		one = func(ctx context.Context, session string) (turnTimes, error) { return g.turn(ctx, run, session) }
	} else {
		nc, js, err := e.connect("bench-driver")
		if err != nil {
			return sample{}, err
		}
		defer nc.Close()
		d, err := newDriver(nc, js, run, p, raw, p.decided(), len(facts) > 0) // facts: a design of the layout phase
		if err != nil {
			return sample{}, err
		}
		defer d.close()
		if err := d.watchFacts(facts); err != nil {
			return sample{}, err
		}
		one, pubErrs = d.turn, d.pubErrs.Load
	}
	var self0, self1, kids0, kids1 time.Duration
	var flush0, flush1, writes0, writes1 uint64
	flushes := diskFlushes(e.dir)
	snc, sjs, err := e.connect("bench-writes")
	if err != nil {
		return sample{}, err
	}
	defer snc.Close()
	stored := func() uint64 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n, _ := e.storedWrites(ctx, sjs)
		return n
	}
	window := func(open bool) {
		if open {
			self0, kids0 = cpuSelf(), cpuOf(pids)
			if flushes != nil {
				flush0, _ = flushes()
			}
			writes0 = stored()
		} else {
			self1, kids1 = cpuSelf(), cpuOf(pids)
			if flushes != nil {
				flush1, _ = flushes()
			}
			writes1 = stored()
		}
		if onWindow != nil {
			onWindow(open)
		}
	}
	res := closedLoop(context.Background(), run, b.cfg.Concurrency, 4, b.cfg.MinTurns, b.cfg.Warmup, b.cfg.Duration, window, one)
	s := sample{Rate: res.rate(), Count: res.Completed, Timeouts: res.Timeouts, Errors: pubErrs() + int64(res.Failed), turns: res.Turns}
	s.ToPendingMs, s.DecisionToOutcomeMs = halves(res.Turns)
	if res.Err != nil {
		return s, fmt.Errorf("%d turns failed, the first: %w", res.Failed, res.Err)
	}
	if res.Completed == 0 {
		return s, fmt.Errorf("no turn completed in the window (%d sent, %d timed out)", res.Sent, res.Timeouts)
	}
	perTurn := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(res.Completed) }
	s.CPUPerTurn = perTurn(self1 - self0)
	if flush1 > flush0 {
		s.DiskFlushesPerTurn = float64(flush1-flush0) / float64(res.Completed)
	}
	if len(pids) > 0 {
		s.StagesCPUPerTurn = perTurn(kids1 - kids0)
	}
	if writes1 > writes0 {
		s.WritesPerTurn = float64(writes1-writes0) / float64(res.Completed)
	}
	return s, nil
}

// cpuSelf is the CPU time (user and system) this process has used.
func cpuSelf() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf is the CPU time (user and system) the processes pids have used,
// from /proc/<pid>/stat (in USER_HZ ticks, 100 per second on Linux).
func cpuOf(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The command name (field 2) may hold spaces; fields after ")".
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(utime+stime) * 10 * time.Millisecond
	}
	return total
}

// startTollgate starts Tollgate's stages in mode on e (and, for the tool
// service path, the bench tool service first, so that the stages find it
// at start). stop stops what it started.
func (b *bencher) startTollgate(e *env, mode string, p path) (a *allInOne, pids []int, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	if p == toolServicePath {
		ts, err := startToolService(e)
		if err != nil {
			return nil, nil, nil, err
		}
		stops = append(stops, ts.stop)
	}
	var plan *planner.Options
	if p == plannerPath {
		if mode != modeAllInOne {
			return nil, nil, nil, fmt.Errorf("the %s path runs all-in-one only", p)
		}
		m, err := startBenchModel()
		if err != nil {
			return nil, nil, nil, err
		}
		stops = append(stops, m.Close)
		plan = &planner.Options{Model: planner.ModelConfig{BaseURL: m.URL, Model: "scripted"}}
	}
	switch mode {
	case modeAllInOne:
		if a, err = startAllInOne(e, b.keys, b.cfg.LogLevel, plan); err != nil {
			stop()
			return nil, nil, nil, err
		}
		stops = append(stops, func() { _ = a.stop() })
	case modeProcesses:
		ps, err := startProcs(e, b.cfg.BinDir, b.cfg.LogLevel)
		if err != nil {
			stop()
			return nil, nil, nil, err
		}
		stops = append(stops, ps.stop)
		pids = ps.pids()
	}
	return a, pids, stop, nil
}

// tollgate measures Tollgate turns of p in mode, with its stages (built-in
// policy) on a fresh server; every turn outcome of the run must be a
// completed turn with every call ok (checkOutcomes). With profile
// (all-in-one only), it writes CPU and allocation profiles of the window
// into the profile directory.
func (b *bencher) tollgate(mode string, p path, st storage, profile bool) (sample, error) {
	e, err := b.startEnv(st)
	if err != nil {
		return sample{}, err
	}
	defer e.close()
	var onWindow func(bool)
	a, pids, stop, err := b.startTollgate(e, mode, p)
	if err != nil {
		return sample{}, err
	}
	defer stop()
	var m0, m1 runtime.MemStats
	var d0, d1, n0, n1, r0, r1, x0, x1, w0, w1, ms0, ms1 float64
	var mc0, mc1 uint64
	var profErr error
	var cpu *os.File
	counters := func() (deferred, started, retried, dead, early float64) {
		return a.counter("tollgate_redrive_outcomes_total", map[string]string{"kind": "deferred"}),
			a.counter("tollgate_redrive_outcomes_total", map[string]string{"kind": "started"}),
			a.counter("tollgate_messages_retried_total", nil),
			a.counter("tollgate_messages_dead_lettered_total", nil),
			a.counter("tollgate_messages_retried_total", map[string]string{"stage": redriver.Stage})
	}
	if a != nil {
		onWindow = func(open bool) {
			if open {
				d0, n0, r0, x0, w0 = counters()
				ms0, mc0 = a.histogram(modelSeconds)
				if profile {
					profErr = writeProfile(filepath.Join(b.cfg.ProfileDir, "allocs-"+p.profileName()+"-base.pprof"), "allocs")
					if cpu, err = os.Create(filepath.Join(b.cfg.ProfileDir, "cpu-"+p.profileName()+".pprof")); err == nil {
						err = pprof.StartCPUProfile(cpu)
					}
					if err != nil {
						profErr = err
					}
				}
				runtime.ReadMemStats(&m0)
				return
			}
			runtime.ReadMemStats(&m1)
			d1, n1, r1, x1, w1 = counters()
			ms1, mc1 = a.histogram(modelSeconds)
			if profile && cpu != nil {
				pprof.StopCPUProfile()
				cpu.Close()
				if err := writeProfile(filepath.Join(b.cfg.ProfileDir, "allocs-"+p.profileName()+".pprof"), "allocs"); err != nil {
					profErr = err
				}
			}
		}
	}
	s, err := b.drive(e, p, false, pids, onWindow)
	if err == nil {
		err = e.checkOutcomes()
	}
	if err != nil {
		return s, err
	}
	if a != nil && s.Count > 0 {
		s.AllocsPerTurn = float64(m1.Mallocs-m0.Mallocs) / float64(s.Count)
		s.BytesPerTurn = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(s.Count)
		s.Retries, s.DeadLetters = r1-r0, x1-x0
		if p == approvalPath && n1 > n0 {
			s.DeferredPerTurn = (d1 - d0) / (n1 - n0)
			s.EarlyPerTurn = (w1 - w0) / (n1 - n0)
		}
		if mc1 > mc0 {
			s.ModelMsPerCall = (ms1 - ms0) * 1000 / float64(mc1-mc0)
		}
	}
	return s, profErr
}

func writeProfile(path, name string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup(name).WriteTo(f, 0)
}

// latSample is one latency run.
type latSample struct {
	Rate     float64         `json:"rate"` // offered turns/s
	Achieved float64         `json:"achieved"`
	Sent     int             `json:"sent"`
	Timeouts int             `json:"timeouts,omitempty"`
	Outcome  []time.Duration `json:"-"`
	Decision []time.Duration `json:"-"` // decision -> approved call started
	Finished []time.Duration `json:"-"` // decision -> approved call's result recorded
	Call     []time.Duration `json:"-"` // approved call started -> its result recorded
	// RoundTrips (tool service path): bare request round trips to the
	// tool service, one per turn interval, during the run.
	RoundTrips []time.Duration `json:"-"`
}

// latency runs an open loop of p at rate turns/s on Tollgate in mode and
// returns the latencies of the turns sent after the warm-up; every turn
// outcome of the run must be a completed turn with every call ok.
func (b *bencher) latency(mode string, p path, rate float64) (latSample, error) {
	e, err := b.startEnv(single)
	if err != nil {
		return latSample{}, err
	}
	defer e.close()
	_, _, stop, err := b.startTollgate(e, mode, p)
	if err != nil {
		return latSample{}, err
	}
	defer stop()
	nc, js, err := e.connect("bench-driver")
	if err != nil {
		return latSample{}, err
	}
	defer nc.Close()
	d, err := newDriver(nc, js, b.runID(), p, false, p.decided(), false)
	if err != nil {
		return latSample{}, err
	}
	defer d.close()
	var stopPings func() ([]time.Duration, error)
	if p == toolServicePath {
		if stopPings, err = pinger(e.url, time.Duration(float64(time.Second)/rate)); err != nil {
			return latSample{}, err
		}
	}
	profile := mode == modeAllInOne && b.cfg.ProfileDir != ""
	name := fmt.Sprintf("latency-%s-%.0f.pprof", p.profileName(), rate)
	if profile {
		cpu, err := os.Create(filepath.Join(b.cfg.ProfileDir, "cpu-"+name))
		if err == nil {
			err = pprof.StartCPUProfile(cpu)
		}
		if err != nil {
			return latSample{}, err
		}
		defer cpu.Close()
	}
	res, err := d.openLoop(context.Background(), rate, b.cfg.Warmup, b.cfg.LatencyDuration)
	if profile {
		pprof.StopCPUProfile()
		if err == nil {
			// What the open loop left live (the collector's mark work),
			// before anything stops: stages, embedded server and driver.
			runtime.GC()
			err = writeProfile(filepath.Join(b.cfg.ProfileDir, "heap-"+name), "heap")
		}
	}
	var rts []time.Duration
	if stopPings != nil {
		var perr error
		rts, perr = stopPings()
		err = errors.Join(err, perr)
	}
	if err == nil {
		err = e.checkOutcomes()
	}
	if err != nil {
		return latSample{}, err
	}
	l := d.latencySamples()
	return latSample{Rate: rate, Achieved: res.Achieved, Sent: res.Sent, Timeouts: res.Timeouts,
		Outcome: l.outcome, Decision: l.decision, Finished: l.finished, Call: l.call, RoundTrips: rts}, nil
}

// halves are the medians of turns' two halves around their decision, in
// milliseconds (sample.ToPendingMs, sample.DecisionToOutcomeMs): 0, 0
// unless every turn was seen requesting approval and decided.
func halves(turns []turnTimes) (toPending, decisionToOutcome float64) {
	var a, b []float64
	for _, t := range turns {
		if t.pending.IsZero() || t.decided.IsZero() {
			return 0, 0
		}
		a = append(a, float64(t.pending.Sub(t.sent))/float64(time.Millisecond))
		b = append(b, float64(t.done.Sub(t.decided))/float64(time.Millisecond))
	}
	if len(a) == 0 {
		return 0, 0
	}
	toPending, _, _ = median(a)
	decisionToOutcome, _, _ = median(b)
	return toPending, decisionToOutcome
}
