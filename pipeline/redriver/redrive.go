// Package redrive is the stage that resumes a batch once every approval in
// it is decided.
//
// It is triggered by each approval's decision, the revision of the
// approval record in the approvals bucket that holds it decided (its own
// durable on the bucket's stream, topology.RedriverConsumer; an earlier
// version's decided events, and the batch-awaiting notices of batches kept
// in the batches bucket, through topology.RedriverNoticesConsumer), but it
// reads its facts only from the records: the batch and each sibling
// approval. Each attempt has one outcome, published on
// tollgate.event.redrive.<kind>.<turn>:
//
//   - deferred: some sibling is still pending (or the batch is not yet
//     waiting). A safe wait, not an error.
//   - started: every sibling is decided; the batch moved awaiting -> started
//     by compare-and-set, so exactly one attempt starts it. The approved
//     calls then run under the batch's persisted TurnContext only, at most
//     once each (execution claims), and the batch completes.
//   - failed: the persisted TurnContext is missing, invalid, or differs
//     between the batch and an approval. Nothing runs; the batch fails with
//     the reason code.
package redriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tracing"
)

// Stage is the redriver's stage name.
const Stage = "redriver"

// Config wires a Redriver.
type Config struct {
	JS          jetstream.JetStream
	Store       *store.Store
	Engine      *batch.Engine
	Policy      *policy.Policy // the current policy, re-checked before each approved call
	Logger      *slog.Logger
	Metrics     *runner.Metrics
	Registerer  prometheus.Registerer // may be nil
	Concurrency int                   // default 64 (see executor.Config.Concurrency)
	// TracerProvider traces each event the stage handles
	// (runner.Config.TracerProvider); nil is otel's global provider.
	TracerProvider trace.TracerProvider
	// The recovery sweep (sweep.go): how often it looks (default
	// DefaultSweepInterval; negative: no passes, while its watch still
	// runs and wakes queued turns) and how long a batch must be untouched
	// before it acts (default DefaultSweepAfter).
	SweepInterval time.Duration
	SweepAfter    time.Duration
}

// Validate reports missing wiring.
func (c Config) Validate() error {
	if c.JS == nil || c.Store == nil || c.Engine == nil || c.Policy == nil || c.Logger == nil || c.Metrics == nil {
		return errors.New("redrive: JS, Store, Engine, Policy, Logger and Metrics are required")
	}
	return nil
}

// Redriver is the redriver stage.
type Redriver struct {
	cfg      Config
	outcomes *prometheus.CounterVec
	sweep    *sweeper
	// grantRechecks counts the grant re-checks that stopped a call, by
	// code (GRANT_REVOKED, GRANT_EXPIRED, GRANT_INVALID).
	grantRechecks *prometheus.CounterVec

	// beforeStart, for tests (export_test.go), runs between a batch's
	// evaluation and its move to started.
	beforeStart atomic.Pointer[func(turnID string)]
}

// New returns a Redriver.
func New(cfg Config) (*Redriver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.SweepAfter <= 0 {
		cfg.SweepAfter = DefaultSweepAfter
	}
	r := &Redriver{cfg: cfg, outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_redrive_outcomes_total", Help: "Redrive attempts by outcome kind (started, deferred, failed).",
	}, []string{"kind"}), grantRechecks: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_grant_rechecks_failed_total", Help: "Grant-approved calls the redriver's grant re-check stopped before they ran, by code.",
	}, []string{"code"})}
	r.sweep = newSweeper(r)
	for _, c := range []**prometheus.CounterVec{&r.outcomes, &r.sweep.actions, &r.grantRechecks} {
		if err := metrics.Register(cfg.Registerer, c); err != nil {
			return nil, err
		}
	}
	// Every code the grant re-check stops a call with exists from the
	// start, at 0 (a rate over them is then 0, not absent).
	for _, code := range []schemas.Code{schemas.CodeGrantRevoked, schemas.CodeGrantExpired, schemas.CodeGrantInvalid} {
		r.grantRechecks.WithLabelValues(string(code))
	}
	return r, nil
}

// Run consumes the approvals bucket's revisions (each decision) and the
// batch-awaiting notices until ctx is cancelled, each through a runner of
// its own (topology.RedriverConsumer, RedriverNoticesConsumer); it returns
// once both have drained, with the first error.
func (r *Redriver) Run(ctx context.Context) error {
	decisions := topology.RedriverConsumer()
	notices := topology.RedriverNoticesConsumer()
	var runners []*runner.Runner
	for _, c := range []struct {
		spec   topology.ConsumerSpec
		handle runner.Handler
		abort  func(context.Context, jetstream.Msg, schemas.Code, error) error
		key    func(jetstream.Msg) string
	}{
		{decisions, r.HandleRevision, r.abortDecision, revisionTurn},
		{notices, r.Handle, r.abort, nil},
	} {
		rn, err := runner.New(runner.Config{
			Component:      Stage,
			Stream:         c.spec.Stream,
			Consumer:       c.spec.Config,
			Handler:        c.handle,
			OnDeadLetter:   c.abort,
			ShardKey:       c.key,
			JS:             r.cfg.JS,
			Logger:         r.cfg.Logger,
			Metrics:        r.cfg.Metrics,
			Concurrency:    r.cfg.Concurrency,
			TracerProvider: r.cfg.TracerProvider,
		})
		if err != nil {
			return err
		}
		runners = append(runners, rn)
	}
	// The sweep stops with ctx and is waited for, so nothing of this stage
	// runs after Run returns.
	// The sweep's watch runs even with its passes off: it wakes the turns
	// queued in their sessions' orders (sweep.go).
	sweepCtx, stopSweep := context.WithCancel(ctx)
	done := runner.Background(sweepCtx, r.cfg.Logger, "recovery sweep", r.sweep.run)
	swept := func() { stopSweep(); done() }
	// Decisions are taken once the sweep's watch has caught up with the
	// turn logs (for at most sweepCatchUp): then a decision on a batch
	// whose awaiting event the watch holds is redriven without reading the
	// batch (redrive, watched). One taken earlier reads it, as always.
	r.waitSweeping(ctx, sweepCatchUp)
	errs := make(chan error, len(runners))
	for _, rn := range runners {
		go func() { errs <- rn.Run(ctx) }()
	}
	var first error
	for range runners {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	swept()
	return first
}

// sweepCatchUp bounds how long Run waits for the sweep's watch to catch
// up before it takes decisions (usually milliseconds; a watch over very
// many open batches may take longer, and then the first decisions read
// their batches).
const sweepCatchUp = 5 * time.Second

// waitSweeping returns once the sweep's watches have caught up, after
// max, or when ctx ends.
func (r *Redriver) waitSweeping(ctx context.Context, max time.Duration) {
	deadline := time.NewTimer(max)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for r.Sweeping() != nil {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
		}
	}
}

// revisionTurn shards the approvals bucket's revisions by turn (the
// approval id's turn, schemas.TurnIDOfApproval), so that the decisions of
// one batch are evaluated one at a time, as its decided events were.
func revisionTurn(m jetstream.Msg) string {
	id := runner.LastToken(m)
	if turn := schemas.TurnIDOfApproval(id); turn != "" {
		return turn
	}
	return id
}

// HandleRevision processes one revision of the approvals bucket: a
// decision (store.DecisionOf) evaluates its batch's barrier, as Handle does
// a decided event; every other revision (a pending record, a vote, a
// marker, a rewrite) is acknowledged with nothing done. A revision that
// does not decode, or holds another approval than its key, is
// dead-lettered with its code and touches no batch.
//
// The decided record the revision holds is the approval the barrier reads
// (a decided record never changes again), so it is not read a second time;
// the batch's other approvals are read. Where the revision was written
// with the bucket's TTL, the batch's end does not read the approval to
// retire it either (batch.Known.Retained).
func (r *Redriver) HandleRevision(ctx context.Context, m jetstream.Msg) error {
	d, err := store.DecisionOf(m.Subject(), m.Headers(), m.Data())
	if err != nil || d == nil {
		return err
	}
	a := d.Record
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrTurnID.String(a.TurnID))
	return r.handle(ctx, m, a.TurnID, "decided:"+a.ApprovalID, d)
}

// Handle processes one event: it names a turn whose barrier is evaluated.
// A decided event that an earlier approver published is evaluated as its
// decision's revision is (HandleRevision).
func (r *Redriver) Handle(ctx context.Context, m jetstream.Msg) error {
	var turnID, trigger string
	_, rec, err := topology.Read(m.Subject(), m.Data(), topology.RouteApprovalDecided, topology.RouteBatchAwaiting)
	switch rec := rec.(type) {
	case *schemas.DecidedEvent:
		turnID, trigger = rec.TurnID, "decided:"+rec.ApprovalID
	case *schemas.TurnNotice:
		turnID, trigger = rec.TurnID, "awaiting"
	default:
		return err
	}
	return r.handle(ctx, m, turnID, trigger, nil)
}

// handle redrives turnID for message m; d, when not nil, is the decision
// m holds (HandleRevision).
func (r *Redriver) handle(ctx context.Context, m jetstream.Msg, turnID, trigger string, d *store.Decision) error {
	if err := schemas.CheckTurnKey(turnID); err != nil {
		return err
	}
	err := r.redrive(ctx, turnID, trigger, d, d != nil)
	var early *errBeforeAwaiting
	if errors.As(err, &early) {
		if md, merr := m.Metadata(); merr == nil {
			if md.NumDelivered > maxAwaitingDeliveries {
				// The executor has not moved the batch on for long (it
				// died, and the sweep re-announces a running batch): the
				// sweep redrives it once it waits (every approval
				// decided), so this trigger is done.
				return r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveDeferred, Reason: early.Error(), Trigger: trigger})
			}
			early.wait = min(minAwaitingRetry<<min(md.NumDelivered-1, 10), maxAwaitingRetry)
		}
	}
	return err
}

// A decision can reach the redriver before its batch waits for it: the
// executor creates a batch's approvals, and only then writes the batch
// awaiting, and the approver may decide (a person, or a standing grant)
// in between. The decided event is then the barrier's only trigger (the
// executor announces nothing: the awaiting write is in the turn's log), so
// it is not acknowledged but waits (runner.Waiting: not a failure), from
// minAwaitingRetry doubling to maxAwaitingRetry, for the batch to wait.
// After maxAwaitingDeliveries, about 10 minutes (the executor died
// mid-step, and the sweep re-announces its running batch after the claim
// lease), it is acknowledged with a deferred outcome: the recovery sweep
// redrives an awaiting batch whose approvals are all decided. The bound
// counts deliveries, not time, so that no clock of another machine enters
// it.
const (
	minAwaitingRetry      = 20 * time.Millisecond
	maxAwaitingRetry      = 5 * time.Second
	maxAwaitingDeliveries = 128
)

// errBeforeAwaiting is Redrive's runner.Waiting error for a batch not yet
// waiting for its approvals (queued or running).
type errBeforeAwaiting struct {
	turn  string
	state schemas.BatchState
	wait  time.Duration
}

func (e *errBeforeAwaiting) Error() string {
	return fmt.Sprintf("batch %s is %s: it does not wait for its approvals yet", e.turn, e.state)
}

// RetryAfter makes it a runner.Waiting error.
func (e *errBeforeAwaiting) RetryAfter() time.Duration { return e.wait }

// abort fails the batch a dead-lettered event was driving (see
// batch.Engine.Abort): a batch whose redrive gave up ends failed rather
// than waiting forever.
func (r *Redriver) abort(ctx context.Context, m jetstream.Msg, code schemas.Code, cause error) error {
	turnID := batch.TurnOf(m.Data())
	if turnID == "" {
		return nil
	}
	if err := r.cfg.Engine.Abort(ctx, turnID, code, cause.Error()); err != nil {
		return err
	}
	return r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveFailed, Code: code, Reason: "redrive gave up: " + cause.Error(), Trigger: "dead-letter"})
}

// abortDecision is abort for a revision of the approvals bucket: the
// batch of the decision it holds fails closed. A revision that is no
// decision, or does not decode, drives no batch.
func (r *Redriver) abortDecision(ctx context.Context, m jetstream.Msg, code schemas.Code, cause error) error {
	ev, err := store.DecidedOf(m.Subject(), m.Headers(), m.Data())
	if err != nil || ev == nil || !schemas.ValidKey(ev.TurnID) {
		return nil
	}
	if err := r.cfg.Engine.Abort(ctx, ev.TurnID, code, cause.Error()); err != nil {
		return err
	}
	return r.publish(ctx, &schemas.RedriveOutcome{TurnID: ev.TurnID, Kind: schemas.RedriveFailed, Code: code, Reason: "redrive gave up: " + cause.Error(), Trigger: "dead-letter"})
}

// Redrive evaluates the batch barrier of turnID and acts on it. It is
// idempotent; trigger is recorded on the published outcome.
func (r *Redriver) Redrive(ctx context.Context, turnID, trigger string) error {
	return r.redrive(ctx, turnID, trigger, nil, false)
}

// redrive is Redrive; d, when not nil, is a decision of one of the batch's
// approvals as the trigger held it (HandleRevision), read from there
// rather than from the bucket. With watched, the batch is taken from the
// awaiting event the recovery sweep's watch of the turn logs last
// delivered of the turn, when it keeps one, rather than read: one read
// fewer per decision. Only the move to started is made from it, a
// compare-and-set at that event's sequence, which fails if the log has
// moved on (the watch lags); every other verdict, and every attempt after
// a conflict, is made on a fresh read.
func (r *Redriver) redrive(ctx context.Context, turnID, trigger string, d *store.Decision, watched bool) error {
	eng := r.cfg.Engine
	get := r.approval
	var known []string
	if d != nil {
		get = func(ctx context.Context, id string) (*schemas.ApprovalRecord, error) {
			if id == d.Record.ApprovalID {
				return d.Record, nil
			}
			return r.approval(ctx, id)
		}
		if d.Retained {
			known = []string{d.Record.ApprovalID}
		}
	}
	b, rev, fromWatch := r.watchedBatch(turnID, watched)
	var err error
	if !fromWatch {
		b, rev, err = r.cfg.Store.Batches.Get(ctx, turnID)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveFailed,
			Code: schemas.CodeBatchRecordMissing, Reason: "no batch record: nothing to redrive", Trigger: trigger})
	case schemas.Permanent(err):
		return err // undecodable record: dead-letter the trigger, never guess
	case err != nil:
		return err
	}

	switch b.State {
	case schemas.BatchCompleted, schemas.BatchFailed:
		return eng.Finish(ctx, b)
	case schemas.BatchStarted:
		// Started by an attempt that died before finishing (or is still
		// running): carry on; claims keep each call at most once.
		return r.run(ctx, b, nil, nil, batch.Known{Batch: b, BatchRev: rev, Retained: known}, true, get)
	case schemas.BatchQueued, schemas.BatchRunning:
		// The executor has not finished writing its approvals: wait for
		// it (errBeforeAwaiting).
		return &errBeforeAwaiting{turn: turnID, state: b.State, wait: minAwaitingRetry}
	}

	// Awaiting: check authority, then the barrier.
	v, err := Evaluate(ctx, eng.Keys(), b, get)
	if err != nil {
		return err
	}
	if fromWatch && v.Kind != schemas.RedriveStarted {
		return r.redrive(ctx, turnID, trigger, d, false)
	}
	switch v.Kind {
	case schemas.RedriveFailed:
		return r.fail(ctx, b, v.Code, v.Reason, trigger)
	case schemas.RedriveDeferred:
		return r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveDeferred, Pending: v.Pending, Reason: v.Reason, Trigger: trigger})
	}
	approvals := v.Approvals
	// The wait for the deciders is a link from this span to the span that
	// requested each approval, not one span open across the wait.
	for _, a := range approvals {
		if a != nil {
			tracing.Link(ctx, a.Trace, tracing.AttrApprovalID.String(a.ApprovalID))
		}
	}
	// Each call is planned before the batch moves to started, so that the
	// move also claims the first call that runs (batch.Engine.Claim): one
	// write for both.
	plans, err := r.plan(ctx, b, approvals)
	if err != nil {
		return err
	}
	if f := r.beforeStart.Load(); f != nil {
		(*f)(turnID)
	}
	// The batch moves to started by compare-and-set at the revision the
	// barrier and its authority were evaluated on, and only then: a batch
	// written since (by a concurrent redriver, or by anyone at all) is
	// evaluated again from a fresh read, never moved on the strength of an
	// evaluation of an older record.
	b.State, b.UpdatedAt = schemas.BatchStarted, eng.Now()
	if first := slices.IndexFunc(plans, func(p CallPlan) bool { return p.Run }); first >= 0 {
		eng.Claim(b, first)
	}
	// The started event keeps the decisions it passed on: a decision made
	// as a request is in no other stream (BatchRecord.Decided). A batch
	// an earlier version kept in tollgate_batches has no such event.
	if !b.Bucketed() {
		b.Decided = decidedOf(approvals)
	}
	startedRev, err := r.cfg.Store.Batches.Update(ctx, turnID, b, rev)
	b.Decided = nil // the event's, not the batch's: no later write repeats them
	if errors.Is(err, store.ErrConflict) {
		return r.redrive(ctx, turnID, trigger, d, false)
	}
	if err != nil {
		return err
	}
	// The move to started is the turn's started event (its log's
	// `started`): no redrive outcome is published for it. Decided
	// approvals never change again, so those just read are current.
	r.outcomes.WithLabelValues(string(schemas.RedriveStarted)).Inc()
	return r.run(ctx, b, approvals, plans, batch.Known{Batch: b, BatchRev: startedRev, Retained: known}, false, get)
}

// watchedBatch is the batch of turnID as the recovery sweep's watch last
// delivered it, with its sequence, when watched is set and the sweep keeps
// the turn's awaiting event (see redrive); ok is false otherwise.
func (r *Redriver) watchedBatch(turnID string, watched bool) (*schemas.BatchRecord, uint64, bool) {
	if !watched {
		return nil, 0, false
	}
	ev, ok := r.sweep.awaitingEvent(turnID)
	if !ok {
		return nil, 0, false
	}
	b, err := store.DecodeLogBatch(ev.Data)
	if err != nil || b.TurnID != turnID || b.State != schemas.BatchAwaiting {
		return nil, 0, false
	}
	return b, ev.Seq, true
}

// ApprovalSource reads approval record id. A missing record is an error
// wrapping store.ErrNotFound; a record that does not decode, a coded error
// (*schemas.Error). The redriver reads KV; a shadow redrive
// (pipeline/replay) reads what a rebuild would leave there.
type ApprovalSource func(ctx context.Context, id string) (*schemas.ApprovalRecord, error)

// approval reads approval record id from KV.
func (r *Redriver) approval(ctx context.Context, id string) (*schemas.ApprovalRecord, error) {
	a, _, err := r.cfg.Store.Approvals.Get(ctx, id)
	return a, err
}

// Verdict is what a redrive attempt on a batch decides before it acts.
type Verdict struct {
	// Kind is the outcome the attempt publishes: started, deferred or
	// failed; "" when the batch is terminal (the attempt only finishes it:
	// outcome and session release, nothing runs).
	Kind    schemas.RedriveKind
	Code    schemas.Code // reason code of a failed verdict
	Reason  string
	Pending int // approvals still pending, for deferred
	// Approvals are the batch's approval records by call index (nil where
	// a call has none), every one decided and bound to the batch's call and
	// TurnContext, when Kind is started.
	Approvals []*schemas.ApprovalRecord
}

// Evaluate is the redriver's decision for batch b, without side effects:
// the state, then the authority (seal and turn of b's TurnContext, keys),
// then the barrier over every sibling approval read through get (each must
// bind b's call and carry b's TurnContext). A terminal batch has no
// verdict kind; a queued or running one is deferred; an awaiting one is
// deferred while any approval is pending and started once all are decided;
// a started one is started again (its calls are claimed at most once), or
// failed with BATCH_STATE_INVALID if an approval is pending. An authority or
// barrier problem is a failed verdict with its reason code. The error is
// only a transient one from get.
//
// Redrive acts on this verdict; a shadow redrive (pipeline/replay) reports
// it.
func Evaluate(ctx context.Context, keys *seal.KeyRing, b *schemas.BatchRecord, get ApprovalSource) (Verdict, error) {
	switch b.State {
	case schemas.BatchCompleted, schemas.BatchFailed:
		return Verdict{Reason: "batch is " + string(b.State)}, nil
	case schemas.BatchQueued, schemas.BatchRunning:
		return Verdict{Kind: schemas.RedriveDeferred, Reason: "batch is " + string(b.State)}, nil
	}
	failed := func(err error) (Verdict, error) {
		if schemas.Permanent(err) {
			return Verdict{Kind: schemas.RedriveFailed, Code: schemas.CodeOf(err), Reason: schemas.ReasonOf(err)}, nil
		}
		return Verdict{}, err
	}
	if err := batch.Authorize(keys, b); err != nil {
		return failed(err)
	}
	approvals, pending, err := loadApprovals(ctx, keys, b, get)
	if err != nil {
		return failed(err)
	}
	switch {
	case pending > 0 && b.State == schemas.BatchStarted:
		// Cannot happen through legal transitions (nothing returns to
		// pending); fail closed rather than run on a partial barrier.
		return Verdict{Kind: schemas.RedriveFailed, Code: schemas.CodeBatchStateInvalid, Reason: "started batch has pending approvals"}, nil
	case pending > 0:
		return Verdict{Kind: schemas.RedriveDeferred, Pending: pending, Reason: fmt.Sprintf("%d approval(s) pending", pending)}, nil
	}
	return Verdict{Kind: schemas.RedriveStarted, Approvals: approvals}, nil
}

// loadApprovals reads every sibling approval of b and checks that each
// carries the batch's own TurnContext and call. It returns the records (nil
// where a call needs none) and how many are still pending.
func loadApprovals(ctx context.Context, keys *seal.KeyRing, b *schemas.BatchRecord, get ApprovalSource) ([]*schemas.ApprovalRecord, int, error) {
	out := make([]*schemas.ApprovalRecord, len(b.Calls))
	pending := 0
	want := schemas.ContextDigest(b.Context)
	for i, id := range b.Approvals {
		if id == "" {
			continue
		}
		a, err := get(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil, 0, schemas.Errorf(schemas.CodeApprovalNotFound, "approval %s of call %d is missing", id, i)
		}
		if err != nil {
			return nil, 0, err
		}
		if a.TurnID != b.TurnID || a.CallID != b.Calls[i].CallID || a.ArgsDigest != b.Calls[i].ArgsDigest || a.Tool != b.Calls[i].Tool {
			return nil, 0, schemas.Errorf(schemas.CodeTurnContextMismatch, "approval %s does not bind call %s of this batch", id, b.Calls[i].CallID)
		}
		if a.Context == nil {
			return nil, 0, schemas.Errorf(schemas.CodeTurnContextMissing, "approval %s has no TurnContext", id)
		}
		if a.Context.LegacyRestored {
			// Restored by the compatibility path from a version 1 record:
			// it has no ingest provenance to compare, but must grant exactly
			// the authority the batch's own context grants.
			if err := keys.Verify(a.Context); err != nil {
				return nil, 0, fmt.Errorf("legacy approval %s: %w", id, err)
			}
			if !schemas.SameAuthority(a.Context, b.Context) {
				return nil, 0, schemas.Errorf(schemas.CodeTurnContextMismatch, "legacy approval %s restores an authority that differs from its batch's", id)
			}
		} else if schemas.ContextDigest(a.Context) != want {
			return nil, 0, schemas.Errorf(schemas.CodeTurnContextMismatch, "approval %s carries a TurnContext that differs from its batch's", id)
		}
		if a.Status == schemas.ApprovalPending {
			pending++
		}
		out[i] = a
	}
	return out, pending, nil
}

// plan decides each call of started batch b with the approvals read for
// it: each approved call is checked again against the current policy and
// its standing grant (PlanCall, recheckGrant); a call whose approval was
// not granted gets the result that says so. A call that the re-check would
// not run but that was claimed already (it has run, or may have) runs
// through its claim, which reports it. It writes nothing.
func (r *Redriver) plan(ctx context.Context, b *schemas.BatchRecord, approvals []*schemas.ApprovalRecord) ([]CallPlan, error) {
	plans := make([]CallPlan, len(b.Calls))
	for i, call := range b.Calls {
		a := approvals[i]
		if b.Results[i] != nil || a == nil {
			continue
		}
		var hints tools.Hints
		if a.Status == schemas.ApprovalApproved {
			var err error
			if hints, err = r.hintsOf(ctx, call.Tool); err != nil {
				return nil, err
			}
		}
		p := PlanCall(r.cfg.Policy, b.Context, call, hints, a)
		if p.Run {
			var err error
			if p, err = r.recheckGrant(ctx, b.Context, call, a, p); err != nil {
				return nil, err
			}
		}
		if p.Code == schemas.CodePolicyChanged || IsGrantCode(p.Code) {
			// Unless it was claimed already: a call that has run (or may
			// have) is reported by its claim, not by today's policy. Only
			// this rare path pays the lookup.
			claimed, err := r.claimed(ctx, b, i)
			if err != nil {
				return nil, err
			}
			if claimed {
				p = CallPlan{Run: true}
			} else {
				r.cfg.Logger.Warn("approved call not run", "turn", b.TurnID, "call", call.CallID, "code", p.Code, "reason", p.Reason)
			}
		}
		plans[i] = p
	}
	return plans, nil
}

// run runs started batch b (known holds it at its revision) and completes
// it. approvals and plans are those the move to started was made on, or
// nil for a batch found started (resumed: an earlier attempt moved it and
// may have claimed its calls), which is evaluated again with its approvals
// read through get. The approved
// calls run in order through a batch.Run, at most once each, under the
// batch's persisted TurnContext only; the first was claimed by the move to
// started. A call's claim is a compare-and-set of the batch, so a batch
// ended meanwhile (aborted by a stage giving up on one of its messages)
// starts no call after the turn's outcome said it would not.
func (r *Redriver) run(ctx context.Context, b *schemas.BatchRecord, approvals []*schemas.ApprovalRecord, plans []CallPlan, known batch.Known, resumed bool, get ApprovalSource) error {
	eng := r.cfg.Engine
	if approvals == nil {
		v, err := Evaluate(ctx, eng.Keys(), b, get)
		if err != nil {
			return err
		}
		if v.Kind == schemas.RedriveFailed {
			return r.fail(ctx, b, v.Code, v.Reason, "run")
		}
		approvals = v.Approvals
	} else if err := eng.Authorize(b); err != nil {
		return r.fail(ctx, b, schemas.CodeOf(err), err.Error(), "run")
	}
	if plans == nil {
		var err error
		if plans, err = r.plan(ctx, b, approvals); err != nil {
			return err
		}
	}
	run := eng.NewRun(known, nil, resumed)
	for i, p := range plans {
		switch {
		case p.Run:
			if err := run.Execute(ctx, i, approvals[i].ApprovalID); errors.Is(err, batch.ErrNotRunning) {
				if cur := run.Known().Batch; cur.State.Terminal() {
					return eng.Finish(ctx, cur)
				}
				return fmt.Errorf("batch %s: %w", b.TurnID, err)
			} else if err != nil {
				return run.KeepOnError(ctx, err) // an earlier call's result is kept
			}
		case p.Status != "" && run.Results()[i] == nil:
			run.Results()[i] = eng.Result(b.Calls[i], p.Status, p.Code, p.Reason, approvals[i].ApprovalID)
		}
	}
	var end *schemas.BatchRecord
	err := run.Carry(ctx, func(ctx context.Context, k batch.Known) error {
		var err error
		end, err = eng.ConcludeFrom(ctx, b.TurnID, k, run.Results(), "", "")
		return err
	})
	if err != nil {
		return err
	}
	r.cfg.Logger.Debug("batch redriven", "turn", b.TurnID, "state", end.State)
	return nil
}

// hintsOf returns the current claims of tool about its effects, for the
// policy re-check. A tool that cannot be resolved now has none: the re-check
// goes on without them, and Execute then fails the call closed with the
// catalog's code (TOOL_NOT_FOUND for a tool that disappeared since the
// approval), unless its claim already holds a result.
func (r *Redriver) hintsOf(ctx context.Context, tool string) (tools.Hints, error) {
	t, err := r.cfg.Engine.Tools().Get(ctx, tool)
	switch {
	case err == nil:
		return tools.SpecOf(t).Hints, nil
	case schemas.Permanent(err):
		return tools.Hints{}, nil
	default:
		return tools.Hints{}, err
	}
}

// claimed reports whether call i of b has an execution claim: in the
// record itself, or for a Legacy batch in tollgate_claims, where a claim
// that does not decode counts as claimed (Execute then fails it closed).
func (r *Redriver) claimed(ctx context.Context, b *schemas.BatchRecord, i int) (bool, error) {
	if !b.Legacy() {
		return b.ClaimOf(i) != nil, nil
	}
	_, _, err := r.cfg.Store.Claims.Get(ctx, b.Calls[i].CallID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err == nil || schemas.Permanent(err):
		return true, nil
	default:
		return false, err
	}
}

// stillGranted re-checks an approved call against the current policy and
// the tool's current hints: the tool must not have become denied for the
// turn's audience, and the approval's deciders must still qualify in the
// number the rule now needs. A call whose tool no longer needs approval
// runs. Decisions recorded without an assurance level predate it; the
// approver has always required a verified decider, so they count as
// verified.
func stillGranted(pol *policy.Policy, tc *schemas.TurnContext, call schemas.ToolCall, hints tools.Hints, a *schemas.ApprovalRecord) error {
	switch pol.ModeFor(call.Tool, tc.Audience, hints) {
	case policy.ModeDeny:
		return fmt.Errorf("policy %s now denies %s for a %s audience (approval was requested under %s)", pol.Version(), call.Tool, tc.Audience, a.PolicyVersion)
	case policy.ModeNever:
		return nil
	}
	votes := a.Votes
	if len(votes) == 0 && a.Decision != nil {
		votes = []schemas.DecisionInfo{*a.Decision}
	}
	granted := map[string]bool{}
	var last error
	for _, v := range votes {
		if err := pol.MayDecide(call.Tool, tc, v.Principal, max(v.Assurance, schemas.AssuranceVerified)); err != nil {
			last = err
			continue
		}
		granted[v.Principal] = true
	}
	need := pol.Quorum(call.Tool, tc)
	if a.Decision != nil && a.Decision.Grant != nil {
		// A standing grant stands in for the quorum only where the policy
		// allows it; the redriver re-checks that (grants.Recheck).
		need = 1
	}
	if len(granted) < need {
		if last != nil {
			return fmt.Errorf("policy %s no longer grants this approval: %v", pol.Version(), last)
		}
		return fmt.Errorf("policy %s needs %d approvals, %d still qualify", pol.Version(), need, len(granted))
	}
	return nil
}

// CallPlan is what running a started batch does with one call that went
// through an approval: run it, or give it a result without running it.
type CallPlan struct {
	Run    bool                 // run the tool (at most once: its execution claim)
	Status schemas.ResultStatus // otherwise the result it gets ("" for none: the approval is still pending)
	Code   schemas.Code
	Reason string
}

// PlanCall is the redriver's decision for call of a started batch whose
// context is tc, given its decided approval a, pol, the current policy, and
// hints, the tool's current claims about its effects (policy.ModeFor):
// an approved call runs unless the policy re-check fails (failed,
// POLICY_CHANGED); a denied, expired or abandoned one gets that result. It
// has no side effects. A call that is already claimed is reported by its
// claim even when the re-check fails: the redriver looks the claim up on
// POLICY_CHANGED and then runs it through Execute, which returns the
// recorded result instead of running the tool again.
func PlanCall(pol *policy.Policy, tc *schemas.TurnContext, call schemas.ToolCall, hints tools.Hints, a *schemas.ApprovalRecord) CallPlan {
	switch a.Status {
	case schemas.ApprovalApproved:
		if err := stillGranted(pol, tc, call, hints, a); err != nil {
			return CallPlan{Status: schemas.ResultFailed, Code: schemas.CodePolicyChanged, Reason: err.Error()}
		}
		return CallPlan{Run: true}
	case schemas.ApprovalDenied:
		return CallPlan{Status: schemas.ResultDenied, Code: schemas.CodeApprovalDenied, Reason: "denied by " + principalOf(a)}
	case schemas.ApprovalExpired:
		return CallPlan{Status: schemas.ResultExpired, Code: schemas.CodeApprovalExpired, Reason: "the approval expired before anyone decided"}
	case schemas.ApprovalAbandoned:
		if by, ok := strings.CutPrefix(principalOf(a), batch.SupersededPrefix); ok {
			return CallPlan{Status: schemas.ResultAbandoned, Code: schemas.CodeTurnSuperseded, Reason: "not run: turn " + by + " of the same session superseded this one while it waited for approval"}
		}
		return CallPlan{Status: schemas.ResultAbandoned, Reason: "the approval was abandoned"}
	}
	return CallPlan{}
}

func principalOf(a *schemas.ApprovalRecord) string {
	if a.Decision != nil {
		return a.Decision.Principal
	}
	return "unknown"
}

// fail ends the batch failed with code (nothing runs) and publishes the
// failed redrive outcome.
func (r *Redriver) fail(ctx context.Context, b *schemas.BatchRecord, code schemas.Code, reason, trigger string) error {
	r.cfg.Logger.Warn("redrive failed closed", "turn", b.TurnID, "code", code, "reason", reason)
	end, err := r.cfg.Engine.End(ctx, b.TurnID, nil, code, reason)
	if err != nil {
		return err
	}
	if err := r.publish(ctx, &schemas.RedriveOutcome{TurnID: b.TurnID, Kind: schemas.RedriveFailed, Code: code, Reason: reason, Trigger: trigger}); err != nil {
		return err
	}
	return r.cfg.Engine.Finish(ctx, end)
}

// publish sends a redrive outcome. Started and failed are published once
// per turn (message id); every deferred attempt is published.
func (r *Redriver) publish(ctx context.Context, o *schemas.RedriveOutcome) error {
	subj, msgID := r.outcomeSubject(o)
	if err := bus.Publish(ctx, r.cfg.JS, subj, msgID, o); err != nil {
		return err
	}
	r.outcomes.WithLabelValues(string(o.Kind)).Inc()
	return nil
}

func (r *Redriver) outcomeSubject(o *schemas.RedriveOutcome) (subject, msgID string) {
	o.At = r.cfg.Engine.Now()
	if o.Kind != schemas.RedriveDeferred {
		msgID = topology.RedriveMsgID(o.Kind, o.TurnID)
	}
	return topology.EventSubject(topology.SubjectRedrive+string(o.Kind)+".", o.TurnID), msgID
}

// decidedOf is the decided events of approvals (the decided ones; nil
// entries are calls that needed none).
func decidedOf(approvals []*schemas.ApprovalRecord) []*schemas.DecidedEvent {
	var out []*schemas.DecidedEvent
	for _, a := range approvals {
		if ev := schemas.DecidedOf(a); ev != nil {
			ev.V = schemas.DecidedEventVersion // embedded: no encoding stamps it
			out = append(out, ev)
		}
	}
	return out
}
