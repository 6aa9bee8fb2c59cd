// Package executor is the stage that turns an accepted turn into a batch:
// it resolves each call's tool and checks its arguments against the tool's
// schema (a call that cannot run fails with TOOL_NOT_FOUND, ARGS_INVALID
// or TOOL_UNAVAILABLE, and nobody is asked), evaluates the tool policy for
// each call, runs allowed calls at once, records denied ones, and writes a
// pending approval record (with the turn's persisted TurnContext and the
// exact call) for each call that needs a person. A batch with no approvals
// completes at once; one with approvals waits (its turn log's awaiting
// event), its approvals are announced, and the redriver resumes it once
// they are decided.
//
// While it runs, the executor also answers topology.SubjectToolsList with
// its tools and their policy modes (toolslist.go; `tollgate tools`).
//
// A session runs one batch at a time, in the order of its entries
// (docs/protocol.md §1.4; the rule is pipeline/batch's order.go): a turn
// whose turn has come (the batch before it ended) has its batch created
// already running (startAtOnce); one whose turn has not come is created
// queued at its place and runs when the end of the batch before it
// announces it. Nothing is written for the session.
package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/sessionorder"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tracing"
)

// Stage is the executor's stage name (metrics label, dead-letter subject).
const Stage = "executor"

// Config wires an Executor.
type Config struct {
	JS         jetstream.JetStream
	Store      *store.Store
	Engine     *batch.Engine
	Policy     *policy.Policy
	Logger     *slog.Logger
	Metrics    *runner.Metrics
	Registerer prometheus.Registerer // may be nil
	// Concurrency is how many sessions are worked on at once, and so how
	// many tool calls run at once at most (default 64). A turn's time is
	// mostly spent waiting on the broker and on tools, so more workers
	// than cores pay: a stage whose workers all wait on acknowledgements
	// caps the turns/s at workers / (its time per turn), whatever the
	// broker could take (docs/bench.md, "Workers per stage").
	Concurrency int
	// TracerProvider traces each message the stage handles
	// (runner.Config.TracerProvider); nil is otel's global provider.
	TracerProvider trace.TracerProvider
	// OrderWait bounds how long a turn waits for an earlier inbound message
	// of its session to become a turn (default DefaultOrderWait; see
	// package sessionorder).
	OrderWait time.Duration
	// PreviewDeadline bounds how long the executor waits for a tool's
	// preview of a call before it writes the call's approval record
	// (default tools.DefaultPreviewDeadline); a preview that takes longer
	// is stored as timed_out. The prompt waits at most this long for it.
	// A batch's previews run at once, away from the workers (previews.go).
	PreviewDeadline time.Duration
	// PreviewsPerTool caps how many previews of one tool run at once in
	// this executor (default DefaultPreviewsPerTool); one that finds no
	// free slot within its deadline is stored as timed_out.
	PreviewsPerTool int
}

// Validate reports missing wiring.
func (c Config) Validate() error {
	if c.JS == nil || c.Store == nil || c.Engine == nil || c.Policy == nil || c.Logger == nil || c.Metrics == nil {
		return errors.New("executor: JS, Store, Engine, Policy, Logger and Metrics are required")
	}
	return nil
}

// Executor is the executor stage.
type Executor struct {
	cfg       Config
	requested prometheus.Counter
	calls     *prometheus.CounterVec
	order     *sessionorder.Checker
	// grantsUsed counts approvals written already decided by a standing
	// grant, by effect (once each: on the approval record's creation).
	grantsUsed *prometheus.CounterVec
	// previews counts the previews asked for approval records, by status.
	previews *prometheus.CounterVec
	// previewer takes the previews of pending approvals (previews.go).
	previewer *previewer
	// beforeAnnounce, when set (tests), runs between a batch's awaiting
	// write and the announcements of its approvals; an error it returns
	// is the handler's, as a crash there would leave things.
	beforeAnnounce atomic.Pointer[func(turn string) error]
	// beforeCreate, when set (tests), runs in startAtOnce between the
	// session's write and the creation of the batch (a crash there).
	beforeCreate atomic.Pointer[func(turn string) error]
}

// DefaultOrderWait bounds how long a turn waits for an earlier inbound
// message of its session that ingest has not turned into a turn.
const DefaultOrderWait = sessionorder.DefaultWait

// New returns an Executor.
func New(cfg Config) (*Executor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 64
	}
	if cfg.OrderWait <= 0 {
		cfg.OrderWait = DefaultOrderWait
	}
	x := &Executor{
		cfg: cfg,
		requested: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_approvals_requested_total", Help: "Approval records created by the executor.",
		}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_executor_calls_total", Help: "Calls evaluated by the executor, by policy mode.",
		}, []string{"mode"}),
		grantsUsed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_grants_used_total", Help: "Approvals the executor decided by a standing grant (no prompt), by effect (approved, denied).",
		}, []string{"effect"}),
		previews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_previews_total", Help: "Previews the executor asked for pending approvals, by status (ok, unsupported, failed, timed_out).",
		}, []string{"status"}),
	}
	if err := metrics.Register(cfg.Registerer, &x.requested); err != nil {
		return nil, err
	}
	order, err := sessionorder.New(sessionorder.Config{
		JS: cfg.JS, Store: cfg.Store, Policy: cfg.Policy, Now: cfg.Engine.Now, Logger: cfg.Logger,
		Registerer: cfg.Registerer, Wait: cfg.OrderWait,
	})
	if err != nil {
		return nil, err
	}
	x.order = order
	if err := metrics.Register(cfg.Registerer, &x.calls); err != nil {
		return nil, err
	}
	if err := metrics.Register(cfg.Registerer, &x.grantsUsed); err != nil {
		return nil, err
	}
	if err := metrics.Register(cfg.Registerer, &x.previews); err != nil {
		return nil, err
	}
	x.previewer = newPreviewer(cfg.PreviewDeadline, cfg.PreviewsPerTool, cfg.Engine.Now,
		func(status string) { x.previews.WithLabelValues(status).Inc() })
	// Both effects exist from the start, at 0, so that a rate over them
	// (the dashboard's) is 0 rather than absent before the first grant use.
	for _, effect := range []schemas.ApprovalStatus{schemas.ApprovalApproved, schemas.ApprovalDenied} {
		x.grantsUsed.WithLabelValues(string(effect))
	}
	return x, nil
}

// Run consumes accepted turns and ready notices until ctx is cancelled,
// and meanwhile answers topology.SubjectToolsList (ListTools).
func (x *Executor) Run(ctx context.Context) error {
	defer x.cfg.Engine.FollowRecords()() // a first entry reads no session record (batch/records.go)
	svc, err := x.serveTools()
	if err != nil {
		return err
	}
	defer svc.Stop()
	consumer := topology.ExecutorConsumer()
	r, err := runner.New(runner.Config{
		Component:      Stage,
		Stream:         consumer.Stream,
		Consumer:       consumer.Config,
		Handler:        x.Handle,
		OnDeadLetter:   x.abort,
		JS:             x.cfg.JS,
		Logger:         x.cfg.Logger,
		Metrics:        x.cfg.Metrics,
		Concurrency:    x.cfg.Concurrency,
		TracerProvider: x.cfg.TracerProvider,
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// Handle processes one message from TOLLGATE_TURNS: an accepted turn (an
// entry of its session's order, or on the accepted subject: a step batch,
// a due follow-up, a turn an earlier version accepted there) or a ready
// notice. A turn whose previews are still running in this process waits
// for them without reading anything (previews.go).
func (x *Executor) Handle(ctx context.Context, m jetstream.Msg) error {
	route, rec, err := topology.Read(m.Subject(), m.Data(), topology.RouteTurnOrder, topology.RouteTurnAccepted, topology.RouteTurnReady)
	switch rec := rec.(type) {
	case *schemas.AcceptedTurn:
		if err := x.previewsPending(rec.TurnID); err != nil {
			return err
		}
		if route != topology.RouteTurnOrder {
			return x.acceptOutside(ctx, rec, m.Data())
		}
		// An entry of its session's order: the batch records its place
		// and runs once its turn has come (batch.Engine.ItsTurn). An entry
		// whose stamp does not read (not this writer's) places nothing.
		return x.accept(ctx, rec, turnorder.Delivered(m, rec.TurnID))
	case *schemas.TurnNotice:
		if err := schemas.CheckTurnKey(rec.TurnID); err != nil {
			return err
		}
		if err := x.previewsPending(rec.TurnID); err != nil {
			return err
		}
		return x.Advance(ctx, rec.TurnID)
	}
	return err
}

// previewsPending is waitingOnPreviews while turn's previews are running
// in this process, nil otherwise.
func (x *Executor) previewsPending(turn string) error {
	if retry, busy := x.previewer.busy(turn); busy {
		return waitingOnPreviews(turn, retry)
	}
	return nil
}

// waitingOnPreviews is the errWaiting of a turn whose previews are not all
// in: it looks again after retry.
func waitingOnPreviews(turn string, retry time.Duration) error {
	return &errWaiting{why: fmt.Sprintf("turn %s: previews still running; looking again in %v", turn, retry), wait: retry}
}

// abort fails the batch a dead-lettered message was driving, if the message
// names one (see batch.Engine.Abort).
func (x *Executor) abort(ctx context.Context, m jetstream.Msg, code schemas.Code, cause error) error {
	turnID := batch.TurnOf(m.Data())
	if turnID == "" {
		return nil
	}
	if err := x.cfg.Engine.Abort(ctx, turnID, code, cause.Error()); err != nil {
		return err
	}
	t, err := schemas.Decode[schemas.AcceptedTurn](m.Data())
	if err != nil || t.TurnID != turnID {
		return nil
	}
	if e := turnorder.Delivered(m, turnID); e != nil && !e.Repeated() {
		// An entry given up on before its batch was created: its batch is
		// created failed at its place, so that the session's next turn
		// (which waits for it to end) runs.
		if err := x.abortUnrecorded(ctx, t, e, code, cause); err != nil {
			return err
		}
	}
	// A turn an earlier version's executor took a session for before
	// creating its batch may hold that session record: let the session's
	// later turns run.
	if t.Context != nil {
		return x.cfg.Engine.ReleaseUnrecorded(ctx, batch.SessionOf(t.Context), turnID)
	}
	return nil
}

// Accept records the batch of an accepted turn (once) and advances it. A
// turn whose NotBefore is still ahead is not recorded yet (see due.go).
func (x *Executor) Accept(ctx context.Context, t *schemas.AcceptedTurn) error {
	return x.accept(ctx, t, nil)
}

// accept is Accept; entry, when not nil, is the entry of its session's
// order that t came as (its stamp and sequence): the batch records the
// place it gives (batch.Engine.Place) and starts once its turn has come.
// A repeated entry places nothing: it goes on from the batch its turn's
// first entry created, or, with none yet, leaves the turn to that entry.
func (x *Executor) accept(ctx context.Context, t *schemas.AcceptedTurn, entry *turnorder.Entry) error {
	if err := schemas.CheckTurnKey(t.TurnID); err != nil {
		return err
	}
	now := x.cfg.Engine.Now()
	if err := notDue(t, now); err != nil {
		return err
	}
	if entry != nil && entry.Repeated() {
		err := x.Advance(ctx, t.TurnID)
		if schemas.CodeOf(err) == schemas.CodeBatchRecordMissing {
			return nil // the turn's first entry, earlier in the order, creates its batch
		}
		return err
	}
	rec := newBatch(t, now)
	var placed batch.Placed
	if entry != nil {
		var err error
		if placed, err = x.cfg.Engine.Place(ctx, entry); err != nil {
			return err
		}
		rec.OrderSeq, rec.OrderAfter = placed.Seq, placed.After
	}
	if started, err := x.startAtOnce(ctx, rec, placed); started || err != nil {
		return err
	}
	rev, err := x.cfg.Store.Batches.Create(ctx, t.TurnID, rec)
	switch {
	case err == nil:
		return x.advance(ctx, rec, rev) // rec is what is stored: no need to read it back
	case errors.Is(err, store.ErrExists):
		return x.advanceExisting(ctx, t.TurnID)
	default:
		return err
	}
}

// newBatch is the queued batch record of accepted turn t, created at now.
func newBatch(t *schemas.AcceptedTurn, now time.Time) *schemas.BatchRecord {
	n := len(t.Calls)
	rec := &schemas.BatchRecord{
		TurnID: t.TurnID, Context: t.Context, Text: t.Text, Calls: t.Calls, Origin: t.Origin, FollowUpDepth: t.FollowUpDepth,
		State: schemas.BatchQueued, Approvals: make([]string, n), Results: make([]*schemas.ToolResult, n),
		CreatedAt: now, UpdatedAt: now,
	}
	if t.Context != nil {
		rec.SessionID = t.Context.SessionID
	}
	return rec
}

// abortUnrecorded creates the batch of t, whose entry e was given up on
// (dead-lettered) before its batch was created, failed with code at the
// place e gives it, and finishes it (its outcome, and the session's next
// turn announced). Nothing runs. A batch that exists meanwhile is left
// to Abort. Like End, it ends the batch only in its turn: until then the
// batch is created queued, and runs or fails when its turn comes.
func (x *Executor) abortUnrecorded(ctx context.Context, t *schemas.AcceptedTurn, e *turnorder.Entry, code schemas.Code, cause error) error {
	eng := x.cfg.Engine
	if _, _, err := x.cfg.Store.Batches.Get(ctx, t.TurnID); !errors.Is(err, store.ErrNotFound) {
		return nil // it exists (Abort ended it or left it in its turn), or cannot be read
	}
	placed, err := eng.Place(ctx, e)
	if err != nil {
		return err
	}
	rec := newBatch(t, eng.Now())
	rec.OrderSeq, rec.OrderAfter = placed.Seq, placed.After
	if _, err := x.cfg.Store.Batches.Create(ctx, t.TurnID, rec); err != nil && !errors.Is(err, store.ErrExists) {
		return err
	}
	return eng.Abort(ctx, t.TurnID, code, cause.Error())
}

// acceptOutside handles t, an accepted turn on the accepted subject rather
// than an entry of its session's order: a step batch of an agent loop
// that is running runs inside the loop's hold (accept, then heldBy); a turn
// whose batch exists (an earlier version's executor created it) goes on
// from it; every other one (a due follow-up, a step whose loop has ended,
// a turn an earlier version's ingest accepted there) joins its session's
// order (enter), and runs when that entry is delivered: one write more,
// for those only.
func (x *Executor) acceptOutside(ctx context.Context, t *schemas.AcceptedTurn, data []byte) error {
	if err := schemas.CheckTurnKey(t.TurnID); err != nil {
		return err
	}
	if err := notDue(t, x.cfg.Engine.Now()); err != nil {
		return err
	}
	if t.Context == nil {
		return x.accept(ctx, t, nil) // in no session: it fails closed at once
	}
	if loop, held, err := x.loopRunning(ctx, t.TurnID, t.Origin); err != nil {
		return err
	} else if held {
		x.cfg.Logger.Debug("step batch runs inside its loop", "turn", t.TurnID, "loop", loop)
		return x.accept(ctx, t, nil)
	}
	if err := x.Advance(ctx, t.TurnID); schemas.CodeOf(err) != schemas.CodeBatchRecordMissing {
		return err // it has a batch: go on from it
	}
	return x.enter(ctx, t, data)
}

// enter appends t to its session's order (turnorder, message id
// order:<turn>: a redelivery appends nothing new), as ingest appends the
// turns it accepts. A turn ordered by arrival (one an earlier version's
// ingest accepted) first waits for the earlier inbound messages of its
// session (sessionorder.Checker.Check).
func (x *Executor) enter(ctx context.Context, t *schemas.AcceptedTurn, data []byte) error {
	w, err := x.cfg.Engine.Orders(ctx)
	if err != nil {
		return err
	}
	probe := newBatch(t, x.cfg.Engine.Now())
	arrival := sessionorder.ArrivalSeq(probe)
	if arrival != 0 {
		if _, err := x.order.Check(ctx, probe); err != nil {
			return err
		}
	}
	a := turnorder.Append{Kind: topology.OrderExec, Key: schemas.SessionKeyOf(t.Context), Turn: t.TurnID,
		Arrival: arrival, Data: data, Header: tracing.Inject(ctx, nil)}
	if _, err := w.Append(ctx, a); err != nil {
		if bus.TooLarge(err) {
			return schemas.Errorf(schemas.CodePayloadTooLarge, "turn %s: join its session's order: %w", t.TurnID, err)
		}
		return fmt.Errorf("turn %s: join its session's order: %w", t.TurnID, err)
	}
	x.cfg.Logger.Debug("turn joined its session's order", "turn", t.TurnID, "origin", t.Origin)
	return nil
}

// advanceExisting is Advance for a turn whose batch record a create just
// found: a redelivery goes on from the stored state. The create was
// refused because the record exists, so a read that finds none is stale:
// a former leader of the replicated store cut off from its peers still
// answers reads (make cluster-test's partition fault found this
// dead-lettering the turn and leaving its batch queued for good). It is a
// transient failure: tried again with the runner's growing delays, which
// outlast a partition that heals.
func (x *Executor) advanceExisting(ctx context.Context, turnID string) error {
	err := x.Advance(ctx, turnID)
	if schemas.CodeOf(err) == schemas.CodeBatchRecordMissing {
		return fmt.Errorf("turn %s: its batch record exists but was not read back (a stale read): %w", turnID, store.ErrNotFound)
	}
	return err
}

// startAtOnce creates the batch of a new accepted turn b (queued, not
// stored yet) already running, when nothing stands between the turn and
// its calls: it came as an entry of its session's order (placed, its
// place), it passes the batch checks, and its turn has come
// (batch.Engine.ItsTurnNow: its predecessor has ended). Then the batch's
// first record is running, with the call that runs at once claimed: one
// write, and none for the session. It reports whether it handled the
// turn; when it did not, it has written nothing, and the turn takes the
// queued path (accept), which writes the batch queued and looks again.
func (x *Executor) startAtOnce(ctx context.Context, b *schemas.BatchRecord, placed batch.Placed) (bool, error) {
	eng := x.cfg.Engine
	if b.OrderSeq == 0 || b.Context == nil || eng.Authorize(b) != nil || checkCalls(b) != nil {
		// A step batch may run inside its agent loop's hold (heldBy); a
		// batch that fails at once is failed from its queued record, in
		// its turn.
		return false, nil
	}
	if !placed.AfterEnded {
		its, err := eng.ItsTurnNow(ctx, b)
		if err != nil || !its {
			return false, err
		}
	}
	plans, err := x.evaluate(ctx, b, false)
	if err != nil {
		return true, err
	}
	b.State, b.UpdatedAt = schemas.BatchRunning, eng.Now()
	if first := firstRun(plans); first >= 0 {
		eng.Claim(b, first)
	}
	if f := x.beforeCreate.Load(); f != nil {
		if err := (*f)(b.TurnID); err != nil {
			return true, err
		}
	}
	rev, err := x.cfg.Store.Batches.Create(ctx, b.TurnID, b)
	switch {
	case errors.Is(err, store.ErrExists):
		return true, x.advanceExisting(ctx, b.TurnID)
	case err != nil:
		return true, err
	}
	return true, x.run(ctx, b, batch.Known{Batch: b, BatchRev: rev}, false, plans)
}

// takeSession applies the session-order rule of an earlier version
// (package sessionorder, the session record) to b, a queued batch without
// a place, and takes its session for it, from snap when it holds the
// session record as just read (nil: read it): batch.Engine.Acquire, which
// queues b behind a busy session. It reports whether b holds its session
// now; an *sessionorder.OutOfOrder error when an earlier turn of the
// session must get in first.
func (x *Executor) takeSession(ctx context.Context, b *schemas.BatchRecord, snap *batch.SessionSnapshot) (bool, error) {
	checked, err := x.order.Check(ctx, b)
	if err != nil {
		return false, err
	}
	if checked != nil {
		snap = checked
	}
	active, err := x.cfg.Engine.Acquire(ctx, batch.SessionOf(b.Context), b.TurnID, sessionorder.ArrivalSeq(b), snap)
	if active && b.Context != nil && b.Context.SessionKey == "" {
		x.cfg.Logger.Info("turn sealed before sessions were scoped by transport: it runs in its legacy session",
			"turn", b.TurnID, "session", b.SessionID, "transport", b.Context.Transport)
	}
	return active, err
}

// firstRun is the index of the first call of plans that runs at once,
// which the write that starts the batch claims (one write for both); -1
// when none does.
func firstRun(plans []callPlan) int {
	return slices.IndexFunc(plans, func(p callPlan) bool { return p.run })
}

// Advance moves the batch of turnID as far as it can go from its current
// state. It is idempotent.
func (x *Executor) Advance(ctx context.Context, turnID string) error {
	b, rev, err := x.cfg.Store.Batches.Get(ctx, turnID)
	if err != nil {
		if schemas.Permanent(err) {
			return err // an undecodable record: dead-letter, never guess
		}
		if errors.Is(err, store.ErrNotFound) {
			return schemas.Errorf(schemas.CodeBatchRecordMissing, "no batch record for turn %s", turnID)
		}
		return err
	}
	return x.advance(ctx, b, rev)
}

// advance is Advance from the batch record b at revision rev, as just read
// or written.
func (x *Executor) advance(ctx context.Context, b *schemas.BatchRecord, rev uint64) error {
	turnID := b.TurnID
	eng := x.cfg.Engine
	if b.Plan {
		// A planner turn's own record: the planner moves it, never an
		// executor. A ready notice for it (a release from an older version,
		// a repeated one) is passed on to the planner.
		switch {
		case b.State.Terminal():
			return eng.Finish(ctx, b)
		case b.State == schemas.BatchQueued:
			return eng.AnnounceBatch(ctx, batch.SessionOf(b.Context), b)
		}
		return nil
	}
	switch b.State {
	case schemas.BatchCompleted, schemas.BatchFailed:
		return eng.Finish(ctx, b)
	case schemas.BatchAwaiting:
		// The redriver's (its decided events). The announcements of its
		// approvals may have been cut short by a crash: made again.
		return x.reannounce(ctx, b)
	case schemas.BatchStarted:
		// The redriver's: its sweep resumes a started batch whose
		// redriver died.
		return nil
	}

	if b.State == schemas.BatchQueued && b.OrderSeq != 0 {
		// Its turn comes first: a batch leaves queued, even to fail,
		// only in its turn (batch.Engine.ItsTurn). Read after the
		// batch's queued write, so that a predecessor that ended
		// meanwhile is seen here or announces this turn.
		its, err := eng.ItsTurn(ctx, b)
		if err != nil {
			return err
		}
		if !its {
			x.cfg.Logger.Debug("turn waits for its turn in its session's order", "turn", b.TurnID, "after", b.OrderAfter)
			return x.supersedeActive(ctx, b)
		}
	}
	if err := eng.Authorize(b); err != nil {
		return x.fail(ctx, b, err)
	}
	if err := checkCalls(b); err != nil {
		return x.fail(ctx, b, err)
	}
	// A batch already running was interrupted part-way (crash or
	// redelivery): approvals it created before must be reused, not
	// re-evaluated under a policy that may have changed since.
	resumed := b.State == schemas.BatchRunning
	var known batch.Known // the records as last read or written, for run
	if b.State == schemas.BatchQueued {
		var held string
		if b.OrderSeq == 0 {
			// No place: a step batch, which runs inside its loop's hold,
			// or a batch an earlier version queued in the session record.
			var snap *batch.SessionSnapshot
			var err error
			held, snap, err = x.heldBy(ctx, b)
			if err != nil {
				return err
			}
			if held == "" {
				active, err := x.takeSession(ctx, b, snap)
				if err != nil {
					return err
				}
				if !active {
					x.cfg.Logger.Info("turn queued behind its session's batch", "turn", b.TurnID, "session", b.SessionID)
					return x.supersedeActive(ctx, b)
				}
			}
		}
		// The calls are evaluated before the batch moves to running, so
		// that the move also claims the first call that runs at once
		// (batch.Engine.Claim): one write for both.
		plans, err := x.evaluate(ctx, b, false)
		if err != nil {
			return err
		}
		first := firstRun(plans)
		started := false
		b, rev, err = x.cfg.Store.Batches.MutateFrom(ctx, turnID, b, rev, func(b *schemas.BatchRecord) error {
			started = false
			if b.State != schemas.BatchQueued {
				return store.ErrSkip
			}
			started = true
			b.State, b.HeldBy, b.UpdatedAt = schemas.BatchRunning, held, eng.Now()
			if first >= 0 {
				eng.Claim(b, first)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if !started {
			// Another worker started it meanwhile (a redelivered copy):
			// go on from what it wrote.
			return x.Advance(ctx, turnID)
		}
		known.Batch, known.BatchRev = b, rev
		return x.run(ctx, b, known, false, plans)
	}
	known.Batch, known.BatchRev = b, rev
	return x.run(ctx, b, known, resumed, nil)
}

// heldBy reports whether queued batch b, which has no place, is a step of
// an agent loop that is running now, and if so returns the loop's turn
// id: the step then runs inside the loop's turn instead of waiting behind
// it (which would deadlock: the loop ends only after its step).
// Otherwise it returns "" and the session record it read, for Acquire (a
// batch an earlier version queued there; a step whose loop ended after
// the step was accepted waits there too).
func (x *Executor) heldBy(ctx context.Context, b *schemas.BatchRecord) (string, *batch.SessionSnapshot, error) {
	if loop, held, err := x.loopRunning(ctx, b.TurnID, b.Origin); err != nil || held {
		return loop, nil, err
	}
	key := schemas.SessionKeyOf(b.Context)
	sess, rev, err := x.cfg.Store.Sessions.Get(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "", &batch.SessionSnapshot{NotFound: true}, nil
	case err != nil:
		return "", nil, fmt.Errorf("load session %s: %w", key, err)
	}
	return "", &batch.SessionSnapshot{Rec: sess, Rev: rev}, nil
}

// loopRunning reports whether turn (with origin) is a step batch of an
// agent loop whose batch has not ended (the loop runs: it started in its
// turn and waits for this step), and names the loop. A loop batch that
// does not exist yet counts as running (an earlier version's loop kept
// no batch until it ended), one that does not decode as ended.
func (x *Executor) loopRunning(ctx context.Context, turn, origin string) (string, bool, error) {
	root, _, ok := schemas.PlannerStepOf(turn)
	if !ok || origin == "" || root != origin {
		return "", false, nil
	}
	loop, _, err := x.cfg.Store.Batches.Get(ctx, root)
	switch {
	case err == nil:
		return root, !loop.State.Terminal() && loop.State != schemas.BatchQueued, nil
	case errors.Is(err, store.ErrNotFound):
		return root, true, nil
	case schemas.Permanent(err):
		return root, false, nil
	}
	return "", false, fmt.Errorf("load the loop %s of step %s: %w", root, turn, err)
}

// callPlan is what the executor does with one call of a running batch
// (evaluate): nothing (it has a result, or waits on an approval already
// requested), settle result, run it now, or ask for an approval.
type callPlan struct {
	result   *schemas.ToolResult     // settled without running: denied, refused
	approval string                  // an approval requested before (a resumed run)
	record   *schemas.ApprovalRecord // that approval as stored
	run      bool                    // mode never: runs now
	ask      bool                    // mode required: an approval record is written
	tool     tools.Tool              // the tool, for a preview (ask)
}

// evaluate decides each call of b without a result or an approval. The
// tool is resolved and the arguments checked against its schema before
// anyone is asked: a call that can only end in TOOL_NOT_FOUND or
// ARGS_INVALID fails now, with no prompt. A resumed run (an earlier
// attempt wrote running, and may have requested approvals before it
// stopped) reuses the approvals that exist instead of evaluating their
// calls again under a policy that may have changed since: run requests
// them with the others in the move to awaiting (the attempt that created
// them died before it). Likewise a call an earlier attempt claimed is
// run (batch.Run.Execute), not evaluated: its tool may have started, so
// only the claim's rule (held, uncertain, taken over, or refused if the
// claim is this engine's and its tool never started) may settle it —
// never a catalog that lost the tool since (TOOL_NOT_FOUND would report
// a call that ran as one that did not) nor a policy changed since. It
// writes nothing.
func (x *Executor) evaluate(ctx context.Context, b *schemas.BatchRecord, resumed bool) ([]callPlan, error) {
	eng, tc := x.cfg.Engine, b.Context
	plans := make([]callPlan, len(b.Calls))
	for i, call := range b.Calls {
		if b.Results[i] != nil || b.Approvals[i] != "" {
			continue
		}
		if resumed {
			id := schemas.ApprovalID(b.TurnID, call.Index)
			rec, _, err := x.cfg.Store.Approvals.Get(ctx, id)
			if err == nil {
				plans[i].approval, plans[i].record = id, rec
				continue
			}
			if !errors.Is(err, store.ErrNotFound) {
				return nil, err
			}
			claimed, err := x.claimed(ctx, b, i)
			if err != nil {
				return nil, err
			}
			if claimed {
				plans[i].run = true
				continue
			}
		}
		tool, spec, unrunnable := eng.Tools().Check(ctx, call.Tool, call.Args)
		if unrunnable != nil && !schemas.Permanent(unrunnable) {
			return nil, unrunnable
		}
		mode := x.cfg.Policy.ModeFor(call.Tool, tc.Audience, spec.Hints)
		x.calls.WithLabelValues(string(mode)).Inc()
		switch {
		case mode != policy.ModeDeny && unrunnable != nil:
			plans[i].result = eng.Result(call, schemas.ResultFailed, schemas.CodeOf(unrunnable), schemas.ReasonOf(unrunnable), "")
		case mode == policy.ModeDeny:
			plans[i].result = eng.Result(call, schemas.ResultDenied, schemas.CodePolicyDenied,
				fmt.Sprintf("policy %s denies %s for a %s audience", x.cfg.Policy.Version(), call.Tool, tc.Audience), "")
		case mode == policy.ModeNever:
			plans[i].run = true
		case !tc.Interactive: // required
			plans[i].result = eng.Result(call, schemas.ResultFailed, schemas.CodeNoInteractiveRequest,
				"the call needs approval and the turn has no requester who can answer a prompt", "")
		default:
			plans[i].ask, plans[i].tool = true, tool
		}
	}
	return plans, nil
}

// claimed reports whether call i of b has a claim: in the batch record,
// or, for a version 1 batch, in tollgate_claims.
func (x *Executor) claimed(ctx context.Context, b *schemas.BatchRecord, i int) (bool, error) {
	if !b.Legacy() {
		return b.ClaimOf(i) != nil, nil
	}
	_, _, err := x.cfg.Store.Claims.Get(ctx, b.Calls[i].CallID)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case schemas.Permanent(err): // a claim that does not decode is still a claim
		return true, nil
	}
	return false, fmt.Errorf("load claim %s: %w", b.Calls[i].CallID, err)
}

// run evaluates (unless plans are given: evaluate's, from before the move
// to running) and runs a batch in state running. known holds b at its
// revision (and the session record, when this call just took it): the
// batch's next transition compare-and-sets from them. run owns b.
//
// The calls that run at once run first, in order (a batch.Run: the first
// was claimed by the move to running), before any approval is asked for:
// nothing that can fail comes between a claim and its run. Then the
// approval records are written, and the batch either completes (nothing to
// wait for) or waits, in one write that carries the results.
func (x *Executor) run(ctx context.Context, b *schemas.BatchRecord, known batch.Known, resumed bool, plans []callPlan) error {
	eng := x.cfg.Engine
	if plans == nil {
		var err error
		if plans, err = x.evaluate(ctx, b, resumed); err != nil {
			return err
		}
	}
	results := slices.Clone(b.Results)
	approvals := slices.Clone(b.Approvals)
	for i, p := range plans {
		switch {
		case p.result != nil:
			results[i] = p.result
		case p.approval != "":
			approvals[i] = p.approval
		}
	}
	run := eng.NewRun(known, results, resumed)
	for i, p := range plans {
		if !p.run {
			continue
		}
		if err := run.Execute(ctx, i, ""); errors.Is(err, batch.ErrNotRunning) {
			return x.Advance(ctx, b.TurnID) // ended meanwhile: go on from there
		} else if err != nil {
			return run.KeepOnError(ctx, err) // an earlier call's result is kept
		}
	}
	results = run.Results()
	type ask struct {
		i   int
		rec *schemas.ApprovalRecord
	}
	var asks []ask // approval records to write, with their previews
	var previews []previewAsk
	// The approvals as stored, announced once the batch waits for them:
	// those an earlier attempt requested, then this one's.
	var announce []*schemas.ApprovalRecord
	for _, p := range plans {
		if p.record != nil {
			announce = append(announce, p.record)
		}
	}
	for i, p := range plans {
		if !p.ask {
			continue
		}
		rec, err := x.newApproval(ctx, b, b.Calls[i])
		if err != nil {
			return run.KeepOnError(ctx, err)
		}
		asks = append(asks, ask{i, rec})
		if rec.Status == schemas.ApprovalPending && p.tool != nil {
			previews = append(previews, previewAsk{id: rec.ApprovalID, tool: p.tool, call: b.Calls[i]})
		}
	}
	if len(asks) > 0 {
		// The previews of every pending approval of the batch, at once
		// and away from this worker: when they are not all in at once,
		// the turn comes back for them (previews.go).
		got, retry := x.previewer.await(ctx, b.TurnID, previews, min(previewInlineWait, x.previewer.deadline))
		if got == nil {
			// The results of the calls that ran must not wait for the
			// previews: a crash meanwhile would leave them uncertain.
			if err := run.Keep(ctx); err != nil {
				return err
			}
			return waitingOnPreviews(b.TurnID, retry)
		}
		for _, a := range asks {
			a.rec.Preview = got[a.rec.ApprovalID] // nil for a decided one
			stored, err := x.requestApproval(ctx, a.rec)
			if err != nil {
				return run.KeepOnError(ctx, err)
			}
			x.previewer.forget(stored.ApprovalID)
			approvals[a.i] = stored.ApprovalID
			announce = append(announce, stored)
		}
	}
	waiting := false // a call waits on its approval
	for i := range b.Calls {
		waiting = waiting || approvals[i] != "" && results[i] == nil
	}

	if !waiting {
		return run.Carry(ctx, func(ctx context.Context, k batch.Known) error {
			_, err := eng.ConcludeFrom(ctx, b.TurnID, k, results, "", "")
			return err
		})
	}
	turnID := b.TurnID
	err := run.Carry(ctx, func(ctx context.Context, k batch.Known) error {
		got, _, err := x.cfg.Store.Batches.MutateFrom(ctx, turnID, k.Batch, k.BatchRev, func(b *schemas.BatchRecord) error {
			if b.State != schemas.BatchRunning {
				return store.ErrSkip
			}
			for i := range b.Calls {
				if b.Results[i] == nil {
					b.Results[i] = results[i]
				}
				if b.Approvals[i] == "" {
					b.Approvals[i] = approvals[i]
				}
			}
			b.State, b.UpdatedAt = schemas.BatchAwaiting, eng.Now()
			b.Requested = requested(b, announce)
			return nil
		})
		if err == nil {
			b = got
		}
		return err
	})
	if err != nil {
		return err
	}
	if b.State != schemas.BatchAwaiting {
		return x.Advance(ctx, b.TurnID)
	}
	// The approvals are announced only now that the batch waits for them,
	// so that a decision made on the announcement (a person, a bot on the
	// event feed, a standing grant's decided event) finds the batch
	// waiting: the redriver would otherwise hold it back until it does. A
	// crash before every announcement is made is made good by the
	// redelivery, which finds the batch awaiting (reannounce).
	if f := x.beforeAnnounce.Load(); f != nil {
		if err := (*f)(b.TurnID); err != nil {
			return err
		}
	}
	for _, rec := range announce {
		if err := x.announce(ctx, b, rec); err != nil {
			return err
		}
	}
	// No awaiting notice: the awaiting write is the turn's event, and a
	// decision that came before it waits for it at the redriver.
	// A turn that queued behind this one while it was running finds it
	// waiting only now.
	return x.supersedeSelf(ctx, b)
}

// requested is what b's move to awaiting keeps of the approvals it
// requested, recs (schemas.BatchRecord.Requested): each as its
// approval-requested event announces it, for a batch kept in its turn's
// log. The move is then the requests' durable record, which the turn
// log's readers and a rebuild read. A batch an earlier version kept in
// tollgate_batches keeps none (its requests are published only).
func requested(b *schemas.BatchRecord, recs []*schemas.ApprovalRecord) []*schemas.ApprovalRecord {
	if b.Bucketed() || len(recs) == 0 {
		return nil
	}
	out := make([]*schemas.ApprovalRecord, 0, len(recs))
	for _, r := range recs {
		if i := slices.Index(b.Approvals, r.ApprovalID); i >= 0 && r.CallID == b.Calls[i].CallID {
			out = append(out, r.AsRequested())
		}
	}
	return out
}

// supersedes reports whether the session policy for b's transport is
// supersede.
func (x *Executor) supersedes(b *schemas.BatchRecord) bool {
	return b.Context != nil && x.cfg.Policy.Busy(b.Context.Transport) == policy.BusySupersede
}

// supersedeActive applies the supersede session policy for b, which just
// started waiting behind its session's turn: a batch waiting on approvals
// has them abandoned, an agent loop is marked superseded, so the session
// moves on to b (batch.Engine.SupersedeBefore for a batch with a place,
// SupersedeActive, by the session record, for one an earlier version
// queued there).
func (x *Executor) supersedeActive(ctx context.Context, b *schemas.BatchRecord) error {
	if !x.supersedes(b) {
		return nil
	}
	if b.OrderSeq != 0 {
		return x.cfg.Engine.SupersedeBefore(ctx, b)
	}
	return x.cfg.Engine.SupersedeActive(ctx, batch.SessionOf(b.Context), b.TurnID)
}

// supersedeSelf applies the supersede policy to b, which just started
// waiting on approvals: if a newer turn of the session is already in the
// order after the turn that holds the session (b, or the agent loop b is
// a step of), b's approvals are abandoned at once (and the loop is marked
// superseded). For a holder without a place (an earlier version's turn)
// the session record's queue says so.
func (x *Executor) supersedeSelf(ctx context.Context, b *schemas.BatchRecord) error {
	if !x.supersedes(b) {
		return nil
	}
	holder := b
	if b.HeldBy != "" {
		loop, _, err := x.cfg.Store.Batches.Get(ctx, b.HeldBy)
		if err != nil {
			return ignoreNotFound(err)
		}
		holder = loop
	}
	var by string
	if holder.OrderSeq != 0 {
		next, _, err := x.cfg.Engine.Next(ctx, holder)
		if err != nil || next == nil {
			return err
		}
		by = next.Turn
	} else {
		s, _, err := x.cfg.Store.Sessions.Get(ctx, schemas.SessionKeyOf(b.Context))
		if err != nil || s.Active != holder.TurnID || len(s.Queue) == 0 {
			return ignoreNotFound(err)
		}
		by = s.Queue[len(s.Queue)-1]
	}
	x.cfg.Logger.Info("waiting batch superseded by a newer turn", "turn", b.TurnID, "by", by)
	if b.HeldBy != "" {
		return x.cfg.Engine.SupersedeLoop(ctx, b.HeldBy, by)
	}
	return x.cfg.Engine.Supersede(ctx, b, by)
}

// ignoreNotFound drops the errors under which superseding is simply not
// possible (no record, or one that does not decode: its own batch's stages
// fail closed on it), so they never fail the superseding turn.
func ignoreNotFound(err error) error {
	if errors.Is(err, store.ErrNotFound) || schemas.Permanent(err) {
		return nil
	}
	return err
}

// newApproval is the approval record call needs, pending or decided by a
// standing grant (grantOrOffer), not written yet and without its preview.
func (x *Executor) newApproval(ctx context.Context, b *schemas.BatchRecord, call schemas.ToolCall) (*schemas.ApprovalRecord, error) {
	eng := x.cfg.Engine
	id := schemas.ApprovalID(b.TurnID, call.Index)
	now := eng.Now()
	rec := &schemas.ApprovalRecord{
		ApprovalID: id, TurnID: b.TurnID, SessionID: b.SessionID, CallID: call.CallID,
		Context: b.Context, Tool: call.Tool, Args: call.Args, ArgsDigest: call.ArgsDigest,
		PolicyVersion: x.cfg.Policy.Version(), Options: x.cfg.Policy.Options(call.Tool),
		Quorum: x.cfg.Policy.Quorum(call.Tool, b.Context),
		Status: schemas.ApprovalPending, RequestedAt: now, Trace: tracing.Context(ctx),
	}
	if d := x.cfg.Policy.ExpiresAfter(call.Tool); d > 0 {
		rec.ExpiresAt = now.Add(d)
	}
	if err := x.grantOrOffer(ctx, b, call, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// requestApproval creates approval record rec (once) and returns the
// record as stored; the batch announces it (announce) once it waits.
//
// A pending record carries the tool's preview of the call (previews.go).
func (x *Executor) requestApproval(ctx context.Context, rec *schemas.ApprovalRecord) (*schemas.ApprovalRecord, error) {
	id := rec.ApprovalID
	_, err := x.cfg.Store.Approvals.Create(ctx, id, rec)
	switch {
	case errors.Is(err, store.ErrExists):
		if rec, _, err = x.cfg.Store.Approvals.Get(ctx, id); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	default:
		x.requested.Inc()
		if rec.Decision != nil && rec.Decision.Grant != nil {
			x.grantsUsed.WithLabelValues(string(rec.Status)).Inc()
		}
	}
	return rec, nil
}

// reannounce announces the approvals of b, which waits for them, again
// (each publish under its message id, so a repeat within the streams'
// duplicate window is stored once; one still pending is announced, one a
// standing grant decided gets its decided and grant events): for a
// redelivery after a crash between the awaiting write and the
// announcements.
func (x *Executor) reannounce(ctx context.Context, b *schemas.BatchRecord) error {
	for _, id := range b.Approvals {
		if id == "" {
			continue
		}
		rec, _, err := x.cfg.Store.Approvals.Get(ctx, id)
		switch {
		case errors.Is(err, store.ErrNotFound), schemas.Permanent(err):
			continue // gone (retention) or undecodable: the redriver fails such a batch closed
		case err != nil:
			return err
		}
		if err := x.announce(ctx, b, rec); err != nil {
			return err
		}
	}
	return nil
}

// announce announces approval rec of b, which now waits for it. For a
// batch kept in its turn's log, the move to awaiting is the request (its
// awaiting event keeps the record: BatchRecord.Requested), so nothing is
// published for a pending approval (issue 36: one write per fact). A
// batch an earlier version kept in tollgate_batches keeps no request: its
// approval-requested event is published (its record as stored, its
// preview summary-only: docs/security.md rule 17) if it is still
// pending, a prompt only ever announced for something that can still be
// answered. An approval a standing grant decided gets what a person's
// decision would have (announceGranted).
func (x *Executor) announce(ctx context.Context, b *schemas.BatchRecord, rec *schemas.ApprovalRecord) error {
	if rec.Decision != nil && rec.Decision.Grant != nil {
		return x.announceGranted(ctx, b, rec) // decided by a standing grant (grants.go)
	}
	if rec.Status != schemas.ApprovalPending || !b.Bucketed() {
		return nil
	}
	return x.publishRequested(ctx, rec)
}

// publishRequested publishes rec's approval-requested event (its preview
// summary-only), for a batch whose log keeps no request.
func (x *Executor) publishRequested(ctx context.Context, rec *schemas.ApprovalRecord) error {
	subj := topology.EventSubject(topology.SubjectApprovalRequested, rec.TurnID)
	return bus.Publish(ctx, x.cfg.JS, subj, topology.RequestedMsgID(rec.ApprovalID), rec.SummaryOnly())
}

// fail ends a batch whose authority or calls are unusable: nothing runs.
func (x *Executor) fail(ctx context.Context, b *schemas.BatchRecord, cause error) error {
	code := schemas.CodeOf(cause)
	if code == "" {
		code = schemas.CodeTurnContextInvalid
	}
	x.cfg.Logger.Warn("batch failed closed", "turn", b.TurnID, "code", code, "err", cause)
	_, err := x.cfg.Engine.Conclude(ctx, b.TurnID, nil, code, cause.Error())
	return err
}

// checkCalls verifies each call is numbered and identified as ingest would
// have done it, so ids used as keys and claims cannot be steered.
func checkCalls(b *schemas.BatchRecord) error {
	for i, c := range b.Calls {
		if c.Index != i || c.CallID != schemas.CallID(b.TurnID, i) {
			return schemas.Errorf(schemas.CodeInvalidInput, "call %d has id %q index %d, want %q", i, c.CallID, c.Index, schemas.CallID(b.TurnID, i))
		}
	}
	return nil
}
