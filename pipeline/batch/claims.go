package batch

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tracing"
)

// ErrClaimHeld means another worker claimed the call recently and has not
// recorded a result yet. It is transient: retry later.
var ErrClaimHeld = errors.New("batch: execution claim held by another worker")

// Execute runs call under tc at most once and returns its result.
//
// Before the tool starts, a claim is created in KV (create-only, so one
// worker wins); the result is written into the claim. A later Execute of the
// same call returns the recorded result without running the tool. If a claim
// exists without a result, Execute returns ErrClaimHeld while the claim is
// younger than ClaimLease, and afterwards a needs_attention result with
// EXECUTION_UNCERTAIN: the tool may have run, so it is not run again.
//
// Callers check tc first (Authorize) and fail the whole batch on a bad
// context; Execute verifies the seal again as the last line of defence and
// returns a failed result, without running the tool, if it does not hold.
// It also fails closed on a call whose arguments do not match their digest.
//
// The tool is resolved and its arguments checked against its schema
// (tools.Catalog.Check) just before the claim. A call whose tool cannot be
// run (TOOL_NOT_FOUND: it disappeared since the call was approved;
// TOOL_UNAVAILABLE; ARGS_INVALID: its schema changed) gets a failed result
// with that code, recorded in the claim like any result, so that every
// later Execute reports the same; a call whose claim already holds a
// result gets that result, whatever the catalog says now.
//
// How the tool's error becomes the result (see tools.ErrUncertain,
// tools.ErrUnavailable): ErrUnavailable is failed TOOL_UNAVAILABLE;
// ErrUncertain is needs_attention EXECUTION_UNCERTAIN (TOOL_REPLY_INVALID
// when the error carries that code), except for a RetrySafe tool, whose
// claim is left without a result, as if its worker had died mid-call:
// Execute returns ErrClaimHeld, and once the lease has passed the call is
// run again under a claim taken over by compare-and-set. Any other error
// is an error result, TOOL_FAILED.
func (e *Engine) Execute(ctx context.Context, tc *schemas.TurnContext, call schemas.ToolCall, approvalID string) (*schemas.ToolResult, error) {
	if res := e.precheck(tc, call, approvalID); res != nil {
		return res, nil
	}
	// refused, when set, is the result of a call whose tool cannot run.
	var refused *schemas.ToolResult
	tool, _, err := e.cfg.Tools.Check(ctx, call.Tool, call.Args)
	if err != nil {
		if !schemas.Permanent(err) {
			return nil, err
		}
		tool, refused = nil, e.Result(call, schemas.ResultFailed, schemas.CodeOf(err), schemas.ReasonOf(err), approvalID)
	}
	if _, busy := e.inflight.LoadOrStore(call.CallID, struct{}{}); busy {
		return nil, fmt.Errorf("call %s is being executed by this engine: %w", call.CallID, ErrClaimHeld)
	}
	defer e.inflight.Delete(call.CallID)
	claim := &schemas.ExecutionClaim{
		CallID: call.CallID, TurnID: tc.TurnID, Tool: call.Tool, ArgsDigest: call.ArgsDigest,
		Worker: e.worker, ClaimedAt: e.Now(), Result: refused,
	}
	rev, err := e.cfg.Store.Claims.Create(ctx, call.CallID, claim)
	switch {
	case errors.Is(err, store.ErrExists):
		return e.claimed(ctx, tc, tool, refused, call, approvalID)
	case err != nil:
		return nil, fmt.Errorf("claim %s: %w", call.CallID, err)
	case refused != nil:
		e.cfg.Logger.Warn("call refused before it ran", "call", call.CallID, "tool", call.Tool, "code", refused.Code, "reason", refused.Reason)
		return refused, nil
	}
	return e.runClaimed(ctx, tc, tool, call, approvalID, claim, rev)
}

// ExecuteIn is Execute for a call of batch b, in state running (the
// executor) or started (the redriver). resumed says that an earlier
// attempt wrote that state, and may have claimed the call before it
// stopped; a stage that has just written it itself passes false.
//
// A claim keeps its result for the retention period from the result's
// write (store.Store.Retain), not until its batch ends: the batch record
// takes the result over in the same step, so no later run of the batch
// needs the claim. Only a run interrupted in between, and resumed a whole
// retention period later, could find the claim gone and run the call
// again. So in a resumed run that began (b.UpdatedAt, the write of its
// state) a retention period ago or more, a call with no claim is not run:
// it gets needs_attention EXECUTION_UNCERTAIN. (The streams keep messages
// no longer than the retention, so such a resumption can only come from
// the redriver's sweep after an outage that long.) Otherwise, and with no
// retention, it is Execute.
func (e *Engine) ExecuteIn(ctx context.Context, b *schemas.BatchRecord, resumed bool, call schemas.ToolCall, approvalID string) (*schemas.ToolResult, error) {
	if ttl := e.cfg.Store.Claims.TTL; resumed && ttl > 0 && e.Now().Sub(b.UpdatedAt) >= ttl {
		_, _, err := e.cfg.Store.Claims.Get(ctx, call.CallID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			e.cfg.Logger.Warn("call of a run resumed after the claims' retention not run", "call", call.CallID, "run_began", b.UpdatedAt)
			return e.Result(call, schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain,
				fmt.Sprintf("the batch's run began at %s, a retention period (%v) ago, and the call has no claim: it may have run and its claim expired, so it is not run again",
					b.UpdatedAt.Format(time.RFC3339), ttl), approvalID), nil
		case err != nil && !schemas.Permanent(err):
			return nil, fmt.Errorf("load claim %s: %w", call.CallID, err)
		}
	}
	return e.Execute(ctx, b.Context, call, approvalID)
}

// runClaimed runs call under the claim this engine holds (at revision rev)
// and records the result in it.
func (e *Engine) runClaimed(ctx context.Context, tc *schemas.TurnContext, tool tools.Tool, call schemas.ToolCall, approvalID string, claim *schemas.ExecutionClaim, rev uint64) (*schemas.ToolResult, error) {
	e.markStarted(call.CallID)
	out, runErr := e.run(ctx, tool, tc, call)
	res, again := e.resultOf(tool, call, approvalID, out, runErr)
	if again {
		return nil, fmt.Errorf("call %s: %v; run again once its claim lease has passed: %w", call.CallID, runErr, ErrClaimHeld)
	}
	e.cfg.Logger.Debug("tool ran", "call", call.CallID, "tool", call.Tool, "status", res.Status, "principal", tc.Requester.Principal)

	// Record the result. The tool has run: try hard, on a context that the
	// caller's cancellation does not cut short.
	claim.Result = res
	return e.recordResult(ctx, call.CallID, claim, rev)
}

// resultOf is the result of call from its tool's run (out, runErr); again
// reports a retry-safe call whose outcome is uncertain instead: it is left
// as a worker that died mid-call leaves it, claimed with no result, to be
// run again once the lease has passed (see Execute).
func (e *Engine) resultOf(tool tools.Tool, call schemas.ToolCall, approvalID, out string, runErr error) (res *schemas.ToolResult, again bool) {
	res = e.Result(call, schemas.ResultOK, "", "", approvalID)
	res.Output = clip(out, MaxOutputBytes)
	switch {
	case errors.Is(runErr, errToolHung):
		res.Status, res.Code = schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain
	case errors.Is(runErr, tools.ErrUncertain) && tools.RetrySafe(tool):
		e.cfg.Logger.Warn("retry-safe call's outcome uncertain; it runs again after its claim lease", "call", call.CallID, "tool", call.Tool, "err", runErr)
		return nil, true
	case errors.Is(runErr, tools.ErrUncertain):
		res.Status, res.Code = schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain
		if schemas.CodeOf(runErr) == schemas.CodeToolReplyInvalid {
			res.Code = schemas.CodeToolReplyInvalid
		}
	case errors.Is(runErr, tools.ErrUnavailable):
		res.Status, res.Code = schemas.ResultFailed, schemas.CodeToolUnavailable
	case runErr != nil:
		res.Status, res.Code = schemas.ResultError, schemas.CodeToolFailed
	}
	if runErr != nil {
		res.Reason = runErr.Error()
		if schemas.CodeOf(runErr) == res.Code {
			res.Reason = schemas.ReasonOf(runErr) // the result carries that code: say it once
		}
		res.Reason = clip(res.Reason, MaxReasonBytes)
	}
	return res, false
}

// recordResult writes res into the claim this engine holds at revision rev.
// The tool has run, so it tries hard: each attempt is short (a write to a
// leader that just died must not use up the budget), on a context the
// caller's cancellation does not cut short, for up to a minute. A conflict
// is not taken at its word: on a replicated bucket the server can report
// one for a write that follows the holder's own acknowledged write, and a
// write whose acknowledgement was lost has already happened. So the claim
// is read again: a recorded result is the answer (ours, or that of a
// worker that took the claim over), a claim still ours without one is
// written again at its new revision.
func (e *Engine) recordResult(ctx context.Context, callID string, claim *schemas.ExecutionClaim, rev uint64) (*schemas.ToolResult, error) {
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer wcancel()
	var werr error
	for attempt := 0; wctx.Err() == nil; attempt++ {
		actx, cancel := context.WithTimeout(wctx, 5*time.Second)
		_, werr = e.cfg.Store.Claims.Update(actx, callID, claim, rev)
		if werr == nil {
			cancel()
			return claim.Result, nil
		}
		if errors.Is(werr, store.ErrConflict) {
			cur, crev, gerr := e.cfg.Store.Claims.Get(actx, callID)
			switch {
			case gerr != nil:
				werr = fmt.Errorf("%w; reading it back: %v", werr, gerr)
			case cur.Result != nil:
				cancel()
				return cur.Result, nil
			case cur.Worker == e.worker:
				rev = crev // still ours, no result: write again
				cancel()
				continue
			default:
				cancel()
				return nil, fmt.Errorf("record result of %s: claim taken over by %s: %w", callID, cur.Worker, werr)
			}
		}
		cancel()
		select {
		case <-wctx.Done():
		case <-time.After(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second)):
		}
	}
	return nil, fmt.Errorf("record result of %s: %w", callID, werr)
}

// Bounds on what a tool's result may add to the batch record, the claim and
// the turn outcome, so that a chatty tool can never make a record too large
// to store (32 calls * (16 KiB args + 8 KiB output + 1 KiB reason) stays
// well under the 1 MiB payload limit).
const (
	MaxOutputBytes = 8 << 10
	MaxReasonBytes = 1 << 10
)

// run calls the tool with a timeout, a copy of the context (a tool cannot
// alter the authority later calls run under) and a recover: a panicking tool
// is a failed call, not a crashed batch.
//
// A tool that ignores its context and outlives ToolTimeout (plus a grace of
// a tenth of it) is left running and reported as errToolHung: the worker
// moves on, and the call is recorded as one whose effect is unknown.
//
// The call is a span ("tool <name>", package tracing), a child of the
// handler's span; a tool that calls out (a NATS tool service, an MCP
// server) passes its trace context on.
func (e *Engine) run(ctx context.Context, tool tools.Tool, tc *schemas.TurnContext, call schemas.ToolCall) (out string, err error) {
	ctx, span := tracing.Start(ctx, "tool "+call.Tool, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(tracing.AttrTool.String(call.Tool), tracing.AttrCallID.String(call.CallID), tracing.AttrTurnID.String(tc.TurnID)))
	defer func() { tracing.End(span, err) }()
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ToolTimeout)
	defer cancel()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	own := *tc
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r = result{"", fmt.Errorf("tool %s panicked: %v", call.Tool, p)}
				e.cfg.Logger.Error("tool panic", "call", call.CallID, "tool", call.Tool, "panic", p)
			}
			done <- r
		}()
		r.out, r.err = tool.Run(rctx, tools.Call{Context: &own, CallID: call.CallID, Args: call.Args})
	}()
	hung := time.NewTimer(e.cfg.ToolTimeout + e.cfg.ToolTimeout/10)
	defer hung.Stop()
	select {
	case r := <-done:
		return r.out, r.err
	case <-hung.C:
		e.cfg.Logger.Error("tool did not return after its timeout; abandoning it", "call", call.CallID, "tool", call.Tool, "timeout", e.cfg.ToolTimeout)
		return "", errToolHung
	}
}

// errToolHung: the tool ignored its context's deadline.
var errToolHung = errors.New("the tool did not return within its timeout and may still complete")

// clip shortens s to at most n bytes (on a rune boundary), marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…[truncated]"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

func hasTurnPrefix(callID, turnID string) bool {
	return len(callID) > len(turnID)+1 && callID[:len(turnID)] == turnID && callID[len(turnID)] == '-'
}

// claimed handles a call whose claim already exists. tool is nil when the
// call cannot run now, refused then being its result.
//
// A claim this engine created without starting the tool (its create was
// stored but the reply was lost, e.g. across a broker restart) is its own
// to use within the lease: the tool certainly did not run, so it runs now
// (or gets refused recorded) instead of waiting out the lease and being
// reported uncertain.
func (e *Engine) claimed(ctx context.Context, tc *schemas.TurnContext, tool tools.Tool, refused *schemas.ToolResult, call schemas.ToolCall, approvalID string) (*schemas.ToolResult, error) {
	for {
		c, rev, err := e.cfg.Store.Claims.Get(ctx, call.CallID)
		if err != nil {
			return nil, fmt.Errorf("load claim %s: %w", call.CallID, err)
		}
		if c.Result != nil {
			return c.Result, nil
		}
		switch e.judgeClaim(call.CallID, c.Worker, c.ClaimedAt, tool) {
		case claimOwn:
			e.cfg.Logger.Info("resuming own claim whose create reply was lost", "call", call.CallID)
			if refused != nil {
				c.Result = refused
				return e.recordResult(ctx, call.CallID, c, rev)
			}
			return e.runClaimed(ctx, tc, tool, call, approvalID, c, rev)
		case claimHeld:
			return nil, e.held(call.CallID, c.Worker, c.ClaimedAt)
		case claimTakeOver:
			// Safe to run again (tools.Retryable): take the claim over by
			// compare-and-set, so exactly one worker re-runs it.
			prev := c.Worker
			c.Worker, c.ClaimedAt = e.worker, e.Now()
			rev, err = e.cfg.Store.Claims.Update(ctx, call.CallID, c, rev)
			if errors.Is(err, store.ErrConflict) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("take over claim %s: %w", call.CallID, err)
			}
			e.cfg.Logger.Warn("re-running a retry-safe call whose worker left no result", "call", call.CallID, "tool", call.Tool, "previous_worker", prev)
			return e.runClaimed(ctx, tc, tool, call, approvalID, c, rev)
		}
		c.Result = e.uncertain(call, c.Worker, c.ClaimedAt, approvalID)
		_, err = e.cfg.Store.Claims.Update(ctx, call.CallID, c, rev)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("mark claim %s uncertain: %w", call.CallID, err)
		}
		e.cfg.Logger.Warn("execution uncertain", "call", call.CallID, "worker", c.Worker)
		return c.Result, nil
	}
}

// claimAction is what an engine does with a call's claim that has no
// result (judgeClaim).
type claimAction int

const (
	claimOwn       claimAction = iota // this engine's within the lease, its tool not started: run it
	claimHeld                         // another's within the lease: ErrClaimHeld
	claimTakeOver                     // past the lease, a retry-safe tool: take it over, run again
	claimUncertain                    // past the lease: EXECUTION_UNCERTAIN, never run again
)

// judgeClaim is the one rule for a claim without a result, whether it is
// a record of tollgate_claims (a version 1 batch, Execute) or an entry of
// the batch record (Run): the claim of call callID by worker at claimedAt,
// tool the call's tool (nil when it cannot run now).
//
// An own claim is the engine's to use only within the lease: past it, it
// is judged like anyone's (taken over or uncertain), so the engine need
// remember the calls it started for one lease only (markStarted).
func (e *Engine) judgeClaim(callID, worker string, claimedAt time.Time, tool tools.Tool) claimAction {
	_, started := e.started.Load(callID)
	age := e.Now().Sub(claimedAt)
	switch {
	case worker == e.worker && !started && age < e.cfg.ClaimLease:
		return claimOwn
	case age < e.cfg.ClaimLease:
		return claimHeld
	case tool != nil && tools.RetrySafe(tool):
		return claimTakeOver
	}
	return claimUncertain
}

// pruneEvery is how many starts pass between two sweeps of started.
const pruneEvery = 1024

// markStarted records that this engine starts call callID's tool now.
// Every pruneEvery starts it drops the entries older than the claim
// lease (plus the tool timeout, for a run still going): judgeClaim no
// longer asks about those calls, and a long-running engine must not keep
// one entry per call it ever ran.
func (e *Engine) markStarted(callID string) {
	now := e.Now()
	e.started.Store(callID, now)
	if e.starts.Add(1)%pruneEvery != 0 {
		return
	}
	horizon := now.Add(-e.cfg.ClaimLease - e.cfg.ToolTimeout)
	e.started.Range(func(k, v any) bool {
		if at, ok := v.(time.Time); ok && at.Before(horizon) {
			e.started.Delete(k)
		}
		return true
	})
}

// held is the ErrClaimHeld of call callID, claimed by worker at claimedAt.
func (e *Engine) held(callID, worker string, claimedAt time.Time) error {
	return fmt.Errorf("call %s claimed by %s %v ago: %w", callID, worker, e.Now().Sub(claimedAt).Round(time.Millisecond), ErrClaimHeld)
}

// uncertain is the result of a call claimed by worker at claimedAt that
// has no result, past the lease.
func (e *Engine) uncertain(call schemas.ToolCall, worker string, claimedAt time.Time, approvalID string) *schemas.ToolResult {
	return e.Result(call, schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain,
		fmt.Sprintf("claimed by %s at %s and no result was recorded; the tool may have run, so it is not run again", worker, claimedAt.Format(time.RFC3339)), approvalID)
}

// ClaimLease is how long an execution claim without a result is honoured
// before the call is reported uncertain.
func (e *Engine) ClaimLease() time.Duration { return e.cfg.ClaimLease }
