package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// ErrNotRunning means a batch left the state in which calls run (running
// for the executor, started for the redriver) while a Run was on it: it
// was ended (aborted by a stage giving up on one of its messages, or ended
// by a concurrent attempt), so no call of it starts any more. The stage
// reads the batch again and goes on from its state (Finish, for an ended
// one).
var ErrNotRunning = errors.New("batch: no longer running its calls")

// Claim claims call i of b for this engine, in a write of b that the
// stage is about to make anyway (the executor's move to running, the
// redriver's move to started): the call's claim is then durable with that
// write, and Run.Execute runs it without a write of its own. A call that
// has a claim already keeps it (Run.Execute then judges it), and a Legacy
// batch (version 1) is left alone: its claims are records of
// tollgate_claims.
func (e *Engine) Claim(b *schemas.BatchRecord, i int) {
	if b.Legacy() || b.ClaimOf(i) != nil {
		return
	}
	e.claim(b, i)
}

// claim sets the claim of call i of b to this engine's, now.
func (e *Engine) claim(b *schemas.BatchRecord, i int) {
	b.SetClaim(i, &schemas.CallClaim{Worker: e.worker, ClaimedAt: e.Now()})
}

// A Run is one stage's pass over the calls of a batch in state running
// (the executor) or started (the redriver): it runs calls at most once
// each, with their claims in the batch record, and holds the results it
// has settled until a write of the batch carries them.
//
// # Execution claims
//
// A call of a version 2 batch is claimed in its batch record: the write
// that sets its entry of Claims is a compare-and-set, so one writer wins,
// and it is durable before the tool starts. The result is not written on
// its own: the run's next write of the batch carries it (the claim of the
// next call, or the stage's write that moves the batch on: awaiting,
// completed), so a call costs one write, not a claim record's two. A claim
// can also ride on the stage's own state write (Engine.Claim): the
// executor's first call is claimed by its move to running, the
// redriver's first approved call by its move to started.
//
// A claim without a result is read as a claim in tollgate_claims was: the
// claiming engine's own claim, whose tool it has not started (its claim
// rode on a state write, or a write's acknowledgement was lost), is run by
// it within the lease; another's is held for the engine's ClaimLease (ErrClaimHeld), then
// the call is reported needs_attention EXECUTION_UNCERTAIN, never run
// again, unless its tool is retry-safe (tools.Retryable), when its claim
// is taken over by compare-and-set and it runs again. A stage that dies
// after a tool ran and before the next write leaves exactly that: a claim
// without a result, reported uncertain.
//
// A Legacy batch (version 1) runs its calls through Execute, with claims
// in tollgate_claims, as the version that wrote it did.
type Run struct {
	e       *Engine
	known   Known
	results []*schemas.ToolResult
	resumed bool
	ran     bool
}

// NewRun starts a run on the batch k holds (at k.BatchRev), which the
// stage just read or wrote in state running or started. results are the
// results the stage has settled so far, by call index (nil entries:
// none); the run keeps them up to date (Results). resumed says that an
// earlier attempt wrote the batch's state and may have claimed its calls
// (see ExecuteIn).
func (e *Engine) NewRun(k Known, results []*schemas.ToolResult, resumed bool) *Run {
	if len(results) < len(k.Batch.Calls) {
		results = append(results, make([]*schemas.ToolResult, len(k.Batch.Calls)-len(results))...)
	}
	r := &Run{e: e, known: k, results: results, resumed: resumed}
	r.adopt()
	if k.Batch.Legacy() {
		e.legacyRuns.Inc()
		e.cfg.Logger.Info("version 1 batch: its calls are claimed in tollgate_claims, as the version that wrote it did", "turn", k.Batch.TurnID, "state", k.Batch.State)
	}
	return r
}

// Results are the run's settled results, by call index: the stage sets
// those of calls it does not run (denied, refused), Execute those it runs,
// and a result the batch record already holds is adopted. The stage's
// next write of the batch must carry every one.
func (r *Run) Results() []*schemas.ToolResult { return r.results }

// Known is the batch as the run last read or wrote it, for the stage's
// next compare-and-set.
func (r *Run) Known() Known { return r.known }

// Ran reports whether a tool ran in this run: its result is then settled
// here and not yet in the batch record.
func (r *Run) Ran() bool { return r.ran }

// Carry makes the stage's write that carries the run's results: write is
// given the batch as the run last knew it, a copy of its own each attempt.
// Once a tool has run, its result must be written whatever happens to the
// caller (recordResult's rule for a claim record): the write is tried
// again after any error but a permanent one, each attempt bounded to 5 s
// (a write to a leader that just died must not use the budget up), on a
// context the caller's cancellation does not cut short, for up to a
// minute. A conflict is the write's own to resolve (a compare-and-set
// reads the record again). Before any tool ran, it is one attempt on ctx.
func (r *Run) Carry(ctx context.Context, write func(context.Context, Known) error) error {
	if !r.ran {
		return write(ctx, r.copyKnown())
	}
	return r.e.hard(ctx, "write the results of calls that ran, batch "+r.known.Batch.TurnID, func(actx context.Context, attempt int) error {
		return write(actx, r.copyKnown())
	})
}

// Keep writes the results the run has settled that the batch record does
// not hold yet, the batch staying in its state: for a stage that stops
// before its write that moves the batch on (waiting for previews, or
// giving the message back on an error), so that a call that ran is not
// left claimed without its result, to be reported uncertain. It writes
// nothing when the record holds them all, or when no tool ran.
func (r *Run) Keep(ctx context.Context) error {
	if !r.ran {
		return nil
	}
	return r.Carry(ctx, func(ctx context.Context, k Known) error {
		want := k.Batch.State
		b, rev, err := r.e.cfg.Store.Batches.MutateFrom(ctx, k.Batch.TurnID, k.Batch, k.BatchRev, func(b *schemas.BatchRecord) error {
			changed := false
			for i, res := range r.results {
				if res != nil && b.Results[i] == nil && b.State == want {
					b.Results[i], changed = res, true
				}
			}
			if !changed {
				return store.ErrSkip
			}
			b.UpdatedAt = r.e.Now()
			return nil
		})
		if err == nil {
			r.known.Batch, r.known.BatchRev = b, rev
		}
		return err
	})
}

// KeepOnError is err, after Keep when err is not nil: a stage returns it
// from a run it gives up on (the message is delivered again), and the
// results of the calls that ran are kept. A failed Keep is logged; err is
// what the stage returns.
func (r *Run) KeepOnError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if kerr := r.Keep(ctx); kerr != nil {
		r.e.cfg.Logger.Error("results of calls that ran not written; they will be reported uncertain", "turn", r.known.Batch.TurnID, "err", kerr)
	}
	return err
}

// copyKnown is the run's Known with a copy of the batch (a write may
// change it in place).
func (r *Run) copyKnown() Known {
	k := r.known
	k.Batch = cloneBatch(r.known.Batch)
	return k
}

// hard runs op until it succeeds or fails permanently, each attempt
// bounded to 5 s, on a context ctx's cancellation does not cut short, for
// up to a minute: for a write that must not be lost once a tool has run.
func (e *Engine) hard(ctx context.Context, what string, op func(context.Context, int) error) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for attempt := 0; ; attempt++ {
		actx, acancel := context.WithTimeout(wctx, 5*time.Second)
		err := op(actx, attempt)
		acancel()
		if err == nil || schemas.Permanent(err) {
			return err
		}
		e.cfg.Logger.Warn("trying again", "what", what, "attempt", attempt+1, "err", err)
		select {
		case <-wctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		}
	}
}

// adopt takes the results the batch record holds over into the run's.
func (r *Run) adopt() {
	for i, res := range r.known.Batch.Results {
		if res != nil {
			r.results[i] = res
		}
	}
}

// Execute runs call i of the batch at most once (approvalID its approval,
// "" if it needed none); its result is then Results()[i]. It returns
// ErrClaimHeld (transient: another worker holds the call's claim, or a
// retry-safe call's outcome is unknown until its lease has passed),
// ErrNotRunning (the batch was ended or moved on: nothing runs), or the
// error of a write or of the tool catalog (transient).
//
// The checks of Execute come first: a context whose seal does not hold,
// a call of another turn, arguments that do not match their digest fail
// the call without a claim; so does a tool the catalog cannot run now
// (TOOL_NOT_FOUND, TOOL_UNAVAILABLE, ARGS_INVALID) when the call has no
// claim. A call whose claim already holds a result, or whose result the
// batch holds, keeps it whatever the catalog says now.
func (r *Run) Execute(ctx context.Context, i int, approvalID string) error {
	e, b := r.e, r.known.Batch
	if i < 0 || i >= len(b.Calls) {
		return fmt.Errorf("batch %s has no call %d", b.TurnID, i)
	}
	call := b.Calls[i]
	if b.Legacy() {
		res, err := e.ExecuteIn(ctx, b, r.resumed, call, approvalID)
		if err != nil {
			return err
		}
		r.results[i], r.ran = res, true
		return nil
	}
	if r.results[i] != nil {
		return nil
	}
	if res := e.precheck(b.Context, call, approvalID); res != nil {
		r.results[i] = res
		return nil
	}
	var refused *schemas.ToolResult
	tool, _, err := e.cfg.Tools.Check(ctx, call.Tool, call.Args)
	if err != nil {
		if !schemas.Permanent(err) {
			return err
		}
		tool, refused = nil, e.Result(call, schemas.ResultFailed, schemas.CodeOf(err), schemas.ReasonOf(err), approvalID)
	}
	if _, busy := e.inflight.LoadOrStore(call.CallID, struct{}{}); busy {
		return fmt.Errorf("call %s is being executed by this engine: %w", call.CallID, ErrClaimHeld)
	}
	defer e.inflight.Delete(call.CallID)
	for {
		b := r.known.Batch
		if res := b.Results[i]; res != nil {
			r.results[i] = res
			return nil
		}
		if b.State != schemas.BatchRunning && b.State != schemas.BatchStarted {
			return fmt.Errorf("call %s of batch %s (state %s): %w", call.CallID, b.TurnID, b.State, ErrNotRunning)
		}
		c := b.ClaimOf(i)
		if c == nil {
			if refused != nil {
				e.cfg.Logger.Warn("call refused before it ran", "call", call.CallID, "tool", call.Tool, "code", refused.Code, "reason", refused.Reason)
				r.results[i] = refused
				return nil
			}
			wrote, err := r.claimFrom(ctx, i, nil)
			if err != nil {
				return fmt.Errorf("claim %s: %w", call.CallID, err)
			}
			if !wrote {
				continue // claimed or ended meanwhile: look again
			}
			return r.runClaimed(ctx, tool, i, approvalID)
		}
		switch e.judgeClaim(call.CallID, c.Worker, c.ClaimedAt, tool) {
		case claimOwn:
			// Its tool not started: claimed by the stage's state write, or
			// by a write whose acknowledgement was lost.
			if refused != nil {
				r.results[i] = refused
				return nil
			}
			return r.runClaimed(ctx, tool, i, approvalID)
		case claimHeld:
			return e.held(call.CallID, c.Worker, c.ClaimedAt)
		case claimTakeOver:
			prev := *c
			wrote, err := r.claimFrom(ctx, i, &prev)
			if err != nil {
				return fmt.Errorf("take over claim %s: %w", call.CallID, err)
			}
			if !wrote {
				continue
			}
			e.cfg.Logger.Warn("re-running a retry-safe call whose worker left no result", "call", call.CallID, "tool", call.Tool, "previous_worker", prev.Worker)
			return r.runClaimed(ctx, tool, i, approvalID)
		}
		e.cfg.Logger.Warn("execution uncertain", "call", call.CallID, "worker", c.Worker)
		r.results[i] = e.uncertain(call, c.Worker, c.ClaimedAt, approvalID)
		return nil
	}
}

// claimFrom writes this engine's claim of call i, if the call's claim in
// the record is still prev (nil: it has none), with the run's settled
// results; it reports whether it wrote.
func (r *Run) claimFrom(ctx context.Context, i int, prev *schemas.CallClaim) (bool, error) {
	return r.write(ctx, func(b *schemas.BatchRecord) bool {
		cur := b.ClaimOf(i)
		if (cur == nil) != (prev == nil) || cur != nil && *cur != *prev {
			return false
		}
		r.e.claim(b, i)
		return true
	})
}

// runClaimed runs call i, which this engine has claimed, and settles its
// result (written by the run's next write).
func (r *Run) runClaimed(ctx context.Context, tool tools.Tool, i int, approvalID string) error {
	e, b := r.e, r.known.Batch
	call := b.Calls[i]
	e.markStarted(call.CallID)
	r.ran = true
	out, runErr := e.run(ctx, tool, b.Context, call)
	res, again := e.resultOf(tool, call, approvalID, out, runErr)
	if again {
		return fmt.Errorf("call %s: %v; run again once its claim lease has passed: %w", call.CallID, runErr, ErrClaimHeld)
	}
	e.cfg.Logger.Debug("tool ran", "call", call.CallID, "tool", call.Tool, "status", res.Status, "principal", b.Context.Requester.Principal)
	r.results[i] = res
	return nil
}

// write makes one compare-and-set write of the batch from the record the
// run holds: fn applies the write's own change to the record (and reports
// false, writing nothing, when the record no longer allows it), and the
// write carries every result the run has settled. A record that changed
// meanwhile is read again and fn applied to it; one that left running or
// started is not written. It reports whether it wrote; either way the run
// then holds the record as it is now.
func (r *Run) write(ctx context.Context, fn func(*schemas.BatchRecord) bool) (bool, error) {
	if !r.ran {
		return r.writeOnce(ctx, fn)
	}
	// It carries the result of a call that ran: it must not be lost.
	var wrote bool
	err := r.e.hard(ctx, "claim a call and write the results of calls that ran, batch "+r.known.Batch.TurnID, func(actx context.Context, _ int) error {
		var err error
		wrote, err = r.writeOnce(actx, fn)
		return err
	})
	return wrote, err
}

// writeOnce is one attempt of write.
func (r *Run) writeOnce(ctx context.Context, fn func(*schemas.BatchRecord) bool) (bool, error) {
	wrote := false
	want := r.known.Batch.State
	b, rev, err := r.e.cfg.Store.Batches.MutateFrom(ctx, r.known.Batch.TurnID, cloneBatch(r.known.Batch), r.known.BatchRev, func(b *schemas.BatchRecord) error {
		wrote = false
		if b.State != want || !fn(b) {
			return store.ErrSkip
		}
		for i, res := range r.results {
			if res != nil && b.Results[i] == nil {
				b.Results[i] = res
			}
		}
		b.UpdatedAt = r.e.Now()
		wrote = true
		return nil
	})
	if err != nil {
		return false, err
	}
	r.known.Batch, r.known.BatchRev = b, rev
	r.adopt()
	return wrote, nil
}

// precheck is Execute's checks before the tool is looked up: the result of
// a call that must not run (nil: it may).
func (e *Engine) precheck(tc *schemas.TurnContext, call schemas.ToolCall, approvalID string) *schemas.ToolResult {
	if err := e.cfg.Keys.Verify(tc); err != nil {
		return e.Result(call, schemas.ResultFailed, schemas.CodeOf(err), schemas.ReasonOf(err), approvalID)
	}
	if !hasTurnPrefix(call.CallID, tc.TurnID) {
		return e.Result(call, schemas.ResultFailed, schemas.CodeTurnContextMismatch, "call does not belong to the turn's context", approvalID)
	}
	if schemas.ArgsDigest(call.Args) != call.ArgsDigest {
		return e.Result(call, schemas.ResultFailed, schemas.CodeArgsDigestMismatch, "arguments do not match their digest", approvalID)
	}
	return nil
}

// cloneBatch copies b deeply enough for a write to change it (the slices a
// stage's write sets entries of) while b stays as it was.
func cloneBatch(b *schemas.BatchRecord) *schemas.BatchRecord {
	c := *b
	c.Approvals = slices.Clone(b.Approvals)
	c.Results = slices.Clone(b.Results)
	c.Claims = slices.Clone(b.Claims)
	return &c
}
