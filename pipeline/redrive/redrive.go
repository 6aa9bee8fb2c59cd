// Package redrive is the stage that resumes a batch once every approval in
// it is decided.
//
// It is triggered by approval-decided events and batch-awaiting notices, but
// reads its facts only from KV: the batch record and each sibling approval
// record. Each attempt has one outcome, published on
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
package redrive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
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
	Concurrency int                   // default 8
	// The recovery sweep (sweep.go): how often it looks (default
	// DefaultSweepInterval; negative disables it) and how long a batch must
	// be untouched before it acts (default DefaultSweepAfter).
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
}

// New returns a Redriver.
func New(cfg Config) (*Redriver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.SweepAfter <= 0 {
		cfg.SweepAfter = DefaultSweepAfter
	}
	r := &Redriver{cfg: cfg, outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_redrive_outcomes_total", Help: "Redrive attempts by outcome kind (started, deferred, failed).",
	}, []string{"kind"})}
	r.sweep = newSweeper(r)
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.outcomes, r.sweep.actions} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run consumes decided events and awaiting notices until ctx is cancelled.
func (r *Redriver) Run(ctx context.Context) error {
	rn, err := runner.New(runner.Config{
		Stage:  Stage,
		Stream: topology.StreamEvents,
		Consumer: jetstream.ConsumerConfig{
			Durable:        topology.ConsumerRedriver,
			FilterSubjects: []string{topology.SubjectApprovalDecided + "*", topology.SubjectBatchAwaiting + "*"},
		},
		Handler:      r.Handle,
		OnDeadLetter: r.abort,
		JS:           r.cfg.JS,
		Logger:       r.cfg.Logger,
		Metrics:      r.cfg.Metrics,
		Concurrency:  r.cfg.Concurrency,
	})
	if err != nil {
		return err
	}
	if r.cfg.SweepInterval < 0 {
		return rn.Run(ctx)
	}
	// The sweep stops with ctx and is waited for, so nothing of this stage
	// runs after Run returns.
	sweepCtx, stopSweep := context.WithCancel(ctx)
	swept := runner.Background(sweepCtx, r.cfg.Logger, "recovery sweep", r.sweep.run)
	err = rn.Run(ctx)
	stopSweep()
	swept()
	return err
}

// Handle processes one event: it names a turn whose barrier is evaluated.
func (r *Redriver) Handle(ctx context.Context, m jetstream.Msg) error {
	var turnID, trigger string
	switch subj := m.Subject(); {
	case strings.HasPrefix(subj, topology.SubjectApprovalDecided):
		ev, err := schemas.Decode[schemas.DecidedEvent](m.Data())
		if err != nil {
			return err
		}
		turnID, trigger = ev.TurnID, "decided:"+ev.ApprovalID
	case strings.HasPrefix(subj, topology.SubjectBatchAwaiting):
		n, err := schemas.Decode[schemas.TurnNotice](m.Data())
		if err != nil {
			return err
		}
		turnID, trigger = n.TurnID, "awaiting"
	default:
		return schemas.Errorf(schemas.CodeUnknownMessage, "redriver does not handle subject %s", subj)
	}
	if !schemas.ValidKey(turnID) {
		return schemas.Errorf(schemas.CodeInvalidInput, "turn id %q is not a valid key", turnID)
	}
	return r.Redrive(ctx, turnID, trigger)
}

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

// Redrive evaluates the batch barrier of turnID and acts on it. It is
// idempotent; trigger is recorded on the published outcome.
func (r *Redriver) Redrive(ctx context.Context, turnID, trigger string) error {
	eng := r.cfg.Engine
	b, _, err := r.cfg.Store.Batches.Get(ctx, turnID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveFailed,
			Code: schemas.CodeBatchRecordMissing, Reason: "no batch record: nothing to redrive", Trigger: trigger})
	case schemas.CodeOf(err) != "":
		return err // undecodable record: dead-letter the trigger, never guess
	case err != nil:
		return err
	}

	switch b.State {
	case schemas.BatchCompleted, schemas.BatchFailed:
		return eng.Finish(ctx, b)
	case schemas.BatchQueued, schemas.BatchRunning:
		// The executor has not finished writing approvals; its awaiting
		// notice will trigger us again.
		return r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveDeferred, Reason: "batch is " + string(b.State), Trigger: trigger})
	case schemas.BatchStarted:
		// Started by an attempt that died before finishing (or is still
		// running): publish "started" (one message id per turn, so this is
		// stored once) and carry on; claims keep each call at most once.
		if err := r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveStarted, Trigger: trigger}); err != nil {
			return err
		}
		return r.run(ctx, b, nil)
	}

	// Awaiting: check authority, then the barrier.
	if err := eng.Authorize(b); err != nil {
		return r.fail(ctx, b, schemas.CodeOf(err), err.Error(), trigger)
	}
	approvals, pending, err := r.load(ctx, b)
	if err != nil {
		if code := schemas.CodeOf(err); code != "" {
			return r.fail(ctx, b, code, err.Error(), trigger)
		}
		return err
	}
	if pending > 0 {
		return r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveDeferred, Pending: pending,
			Reason: fmt.Sprintf("%d approval(s) pending", pending), Trigger: trigger})
	}
	started, _, err := r.cfg.Store.Batches.Mutate(ctx, turnID, func(b *schemas.BatchRecord) error {
		if b.State != schemas.BatchAwaiting {
			return store.ErrSkip
		}
		b.State, b.UpdatedAt = schemas.BatchStarted, eng.Now()
		return nil
	})
	if err != nil {
		return err
	}
	if started.State != schemas.BatchStarted {
		return r.Redrive(ctx, turnID, trigger) // another redriver moved it on
	}
	// Whether this attempt or a concurrent one made the move, "started" is
	// published under one message id per turn.
	if err := r.publish(ctx, &schemas.RedriveOutcome{TurnID: turnID, Kind: schemas.RedriveStarted, Trigger: trigger}); err != nil {
		return err
	}
	// Decided approvals never change again, so those just read are current.
	return r.run(ctx, started, approvals)
}

// load reads every sibling approval of b and checks that each carries the
// batch's own TurnContext and call. It returns the records (nil where a call
// needs none) and how many are still pending.
func (r *Redriver) load(ctx context.Context, b *schemas.BatchRecord) ([]*schemas.ApprovalRecord, int, error) {
	out := make([]*schemas.ApprovalRecord, len(b.Calls))
	pending := 0
	want := schemas.ContextDigest(b.Context)
	for i, id := range b.Approvals {
		if id == "" {
			continue
		}
		a, _, err := r.cfg.Store.Approvals.Get(ctx, id)
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
			if err := r.cfg.Engine.Keys().Verify(a.Context); err != nil {
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

// run executes a started batch: approved calls run, others get the result
// their approval's status dictates, then the batch completes.
// approvals are the batch's approval records as load returned them, or nil
// to load them here (a batch found already started).
func (r *Redriver) run(ctx context.Context, b *schemas.BatchRecord, approvals []*schemas.ApprovalRecord) error {
	eng := r.cfg.Engine
	if err := eng.Authorize(b); err != nil {
		return r.fail(ctx, b, schemas.CodeOf(err), err.Error(), "run")
	}
	pending := 0
	if approvals == nil {
		var err error
		if approvals, pending, err = r.load(ctx, b); err != nil {
			if code := schemas.CodeOf(err); code != "" {
				return r.fail(ctx, b, code, err.Error(), "run")
			}
			return err
		}
	}
	if pending > 0 {
		// Cannot happen through legal transitions (nothing returns to
		// pending); fail closed rather than run on a partial barrier.
		return r.fail(ctx, b, schemas.CodeBatchStateInvalid, "started batch has pending approvals", "run")
	}
	results := make([]*schemas.ToolResult, len(b.Calls))
	for i, call := range b.Calls {
		a := approvals[i]
		if b.Results[i] != nil || a == nil {
			continue
		}
		switch a.Status {
		case schemas.ApprovalApproved:
			// The batch may have been ended meanwhile (aborted by a stage
			// giving up on one of its messages): an approved call must not
			// start after the turn's outcome said it would not.
			cur, _, err := r.cfg.Store.Batches.Get(ctx, b.TurnID)
			if err != nil {
				return err
			}
			if cur.State.Terminal() {
				return eng.Finish(ctx, cur)
			}
			if err := r.stillGranted(b.Context, call, a); err != nil {
				// Unless it was claimed already: a call that has run (or
				// may have) is reported by its claim, through Execute, not
				// by today's policy. Only this rare path pays the lookup.
				claimed, cerr := r.claimed(ctx, call.CallID)
				if cerr != nil {
					return cerr
				}
				if !claimed {
					r.cfg.Logger.Warn("approved call not run: policy changed", "turn", b.TurnID, "call", call.CallID, "err", err)
					results[i] = eng.Result(call, schemas.ResultFailed, schemas.CodePolicyChanged, err.Error(), a.ApprovalID)
					continue
				}
			}
			res, err := eng.Execute(ctx, b.Context, call, a.ApprovalID)
			if err != nil {
				return err
			}
			results[i] = res
		case schemas.ApprovalDenied:
			results[i] = eng.Result(call, schemas.ResultDenied, schemas.CodeApprovalDenied, "denied by "+principalOf(a), a.ApprovalID)
		case schemas.ApprovalExpired:
			results[i] = eng.Result(call, schemas.ResultExpired, schemas.CodeApprovalExpired, "the approval expired before anyone decided", a.ApprovalID)
		case schemas.ApprovalAbandoned:
			if by, ok := strings.CutPrefix(principalOf(a), batch.SupersededPrefix); ok {
				results[i] = eng.Result(call, schemas.ResultAbandoned, schemas.CodeTurnSuperseded, "not run: turn "+by+" of the same session superseded this one while it waited for approval", a.ApprovalID)
				continue
			}
			results[i] = eng.Result(call, schemas.ResultAbandoned, "", "the approval was abandoned", a.ApprovalID)
		}
	}
	end, err := eng.Conclude(ctx, b.TurnID, results, "", "")
	if err != nil {
		return err
	}
	r.cfg.Logger.Info("batch redriven", "turn", b.TurnID, "state", end.State)
	return nil
}

// claimed reports whether call id has an execution claim. A claim that
// does not decode counts as claimed: Execute then fails it closed.
func (r *Redriver) claimed(ctx context.Context, callID string) (bool, error) {
	_, _, err := r.cfg.Store.Claims.Get(ctx, callID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err == nil || schemas.CodeOf(err) != "":
		return true, nil
	default:
		return false, err
	}
}

// stillGranted re-checks an approved call against the current policy: the
// tool must not have become denied for the turn's audience, and the
// approval's deciders must still qualify in the number the rule now needs.
// A call whose tool no longer needs approval runs. Decisions recorded
// without an assurance level predate it; the approver has always required
// a verified decider, so they count as verified.
func (r *Redriver) stillGranted(tc *schemas.TurnContext, call schemas.ToolCall, a *schemas.ApprovalRecord) error {
	pol := r.cfg.Policy
	switch pol.ModeFor(call.Tool, tc.Audience) {
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
	if need := pol.Quorum(call.Tool, tc); len(granted) < need {
		if last != nil {
			return fmt.Errorf("policy %s no longer grants this approval: %v", pol.Version(), last)
		}
		return fmt.Errorf("policy %s needs %d approvals, %d still qualify", pol.Version(), need, len(granted))
	}
	return nil
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
	o.At = r.cfg.Engine.Now()
	msgID := ""
	if o.Kind != schemas.RedriveDeferred {
		msgID = "redrive:" + string(o.Kind) + ":" + o.TurnID
	}
	subj := topology.EventSubject(topology.SubjectRedrive+string(o.Kind)+".", o.TurnID)
	if err := bus.Publish(ctx, r.cfg.JS, subj, msgID, o); err != nil {
		return err
	}
	r.outcomes.WithLabelValues(string(o.Kind)).Inc()
	return nil
}
