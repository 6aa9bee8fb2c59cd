// Package batch holds the batch logic that the executor and the redriver
// share: running a call at most once (execution claims), ending a batch in
// exactly one terminal state, publishing its outcome, and the per-session
// queue that runs a session's batches one at a time in arrival order.
//
// Every function here is idempotent: called again after a crash or a
// redelivery, it converges to the same records and publishes with the same
// message ids.
package batch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// ErrClaimHeld means another worker claimed the call recently and has not
// recorded a result yet. It is transient: retry later.
var ErrClaimHeld = errors.New("batch: execution claim held by another worker")

// Config wires an Engine.
type Config struct {
	JS     jetstream.JetStream
	Store  *store.Store
	Tools  *tools.Registry
	Keys   *seal.KeyRing // verifies the seal of every context a call runs under
	Worker string        // recorded on claims, e.g. "executor@host:pid"
	Logger *slog.Logger

	// ClaimLease is how long a claim without a result is presumed to belong
	// to a live worker. After it, the call's fate is unknown and it is
	// reported needs_attention rather than run again. Default 2m.
	ClaimLease time.Duration
	// ToolTimeout bounds one tool run. Default 1m; must be below ClaimLease.
	ToolTimeout time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
}

// Validate reports missing wiring.
func (c *Config) Validate() error {
	switch {
	case c.JS == nil || c.Store == nil || c.Tools == nil || c.Keys == nil || c.Logger == nil:
		return errors.New("batch: JS, Store, Tools, Keys and Logger are required")
	case c.Worker == "":
		return errors.New("batch: Worker is required")
	}
	if c.ClaimLease == 0 {
		c.ClaimLease = 2 * time.Minute
	}
	if c.ToolTimeout == 0 {
		c.ToolTimeout = time.Minute
	}
	if c.ToolTimeout >= c.ClaimLease {
		return fmt.Errorf("batch: ToolTimeout %v must be below ClaimLease %v", c.ToolTimeout, c.ClaimLease)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Engine runs calls and ends batches.
type Engine struct {
	cfg Config

	mu     sync.Mutex
	events jetstream.Stream // handle on the events stream, bound on first use

	// worker is cfg.Worker plus a random suffix, unique to this engine, so
	// a claim can be recognised as its own; started holds the call ids
	// whose tool this engine started (see claimed); inflight the call ids
	// an Execute of this engine is claiming or running right now, so that
	// two goroutines of one engine (the executor and the redriver share
	// one in a single process) never both take its own claim for theirs.
	worker   string
	started  sync.Map
	inflight sync.Map
}

// New validates cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	nonce := make([]byte, 4)
	rand.Read(nonce)
	return &Engine{cfg: cfg, worker: cfg.Worker + "#" + hex.EncodeToString(nonce)}, nil
}

// HasTool reports whether a tool called name is registered.
func (e *Engine) HasTool(name string) bool {
	_, ok := e.cfg.Tools.Get(name)
	return ok
}

// Authorize reports whether b's persisted TurnContext is an authentic,
// usable authority for b: sealed by a key of the ring (seal.KeyRing.Verify)
// and captured for b's turn, or for the turn whose call scheduled b as
// follow-up work. It returns a coded error (TURN_CONTEXT_MISSING,
// TURN_CONTEXT_TAMPERED, SEAL_KEY_UNKNOWN, TURN_CONTEXT_INVALID,
// TURN_CONTEXT_MISMATCH, ...) on which callers fail the batch closed.
func (e *Engine) Authorize(b *schemas.BatchRecord) error { return Authorize(e.cfg.Keys, b) }

// Authorize is Engine.Authorize with the key ring keys, for code that
// judges a batch without an engine (a shadow redrive, pipeline/replay).
func Authorize(keys *seal.KeyRing, b *schemas.BatchRecord) error {
	if err := keys.Verify(b.Context); err != nil {
		return err
	}
	return b.Context.CheckFor(b.TurnID)
}

// Worker is the id this engine records on its claims: the configured
// Worker plus a suffix unique to the engine.
func (e *Engine) Worker() string { return e.worker }

// Keys is the engine's key ring.
func (e *Engine) Keys() *seal.KeyRing { return e.cfg.Keys }

// Now is the engine's clock.
func (e *Engine) Now() time.Time { return e.cfg.Now().UTC() }

// Result builds a result for a call that did not run.
func (e *Engine) Result(call schemas.ToolCall, status schemas.ResultStatus, code schemas.Code, reason, approvalID string) *schemas.ToolResult {
	return &schemas.ToolResult{CallID: call.CallID, Tool: call.Tool, Status: status, Code: code, Reason: reason, ApprovalID: approvalID, FinishedAt: e.Now()}
}

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
func (e *Engine) Execute(ctx context.Context, tc *schemas.TurnContext, call schemas.ToolCall, approvalID string) (*schemas.ToolResult, error) {
	if err := e.cfg.Keys.Verify(tc); err != nil {
		return e.Result(call, schemas.ResultFailed, schemas.CodeOf(err), err.Error(), approvalID), nil
	}
	if !hasTurnPrefix(call.CallID, tc.TurnID) {
		return e.Result(call, schemas.ResultFailed, schemas.CodeTurnContextMismatch, "call does not belong to the turn's context", approvalID), nil
	}
	if schemas.ArgsDigest(call.Args) != call.ArgsDigest {
		return e.Result(call, schemas.ResultFailed, schemas.CodeArgsDigestMismatch, "arguments do not match their digest", approvalID), nil
	}
	tool, ok := e.cfg.Tools.Get(call.Tool)
	if !ok {
		return e.Result(call, schemas.ResultFailed, schemas.CodeToolNotFound, fmt.Sprintf("no tool named %q", call.Tool), approvalID), nil
	}
	if _, busy := e.inflight.LoadOrStore(call.CallID, struct{}{}); busy {
		return nil, fmt.Errorf("call %s is being executed by this engine: %w", call.CallID, ErrClaimHeld)
	}
	defer e.inflight.Delete(call.CallID)
	claim := &schemas.ExecutionClaim{
		CallID: call.CallID, TurnID: tc.TurnID, Tool: call.Tool, ArgsDigest: call.ArgsDigest,
		Worker: e.worker, ClaimedAt: e.Now(),
	}
	rev, err := e.cfg.Store.Claims.Create(ctx, call.CallID, claim)
	if errors.Is(err, store.ErrExists) {
		return e.claimed(ctx, tc, tool, call, approvalID)
	}
	if err != nil {
		return nil, fmt.Errorf("claim %s: %w", call.CallID, err)
	}
	return e.runClaimed(ctx, tc, tool, call, approvalID, claim, rev)
}

// runClaimed runs call under the claim this engine holds (at revision rev)
// and records the result in it.
func (e *Engine) runClaimed(ctx context.Context, tc *schemas.TurnContext, tool tools.Tool, call schemas.ToolCall, approvalID string, claim *schemas.ExecutionClaim, rev uint64) (*schemas.ToolResult, error) {
	e.started.Store(call.CallID, struct{}{})
	out, runErr := e.run(ctx, tool, tc, call)
	res := e.Result(call, schemas.ResultOK, "", "", approvalID)
	res.Output = clip(out, MaxOutputBytes)
	switch {
	case errors.Is(runErr, errToolHung):
		res.Status, res.Code, res.Reason = schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain, runErr.Error()
	case runErr != nil:
		res.Status, res.Code, res.Reason = schemas.ResultError, schemas.CodeToolFailed, clip(runErr.Error(), MaxReasonBytes)
	}
	e.cfg.Logger.Debug("tool ran", "call", call.CallID, "tool", call.Tool, "status", res.Status, "principal", tc.Requester.Principal)

	// Record the result. The tool has run: try hard, on a context that the
	// caller's cancellation does not cut short.
	claim.Result = res
	return e.recordResult(ctx, call.CallID, claim, rev)
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
func (e *Engine) run(ctx context.Context, tool tools.Tool, tc *schemas.TurnContext, call schemas.ToolCall) (string, error) {
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

// claimed handles a call whose claim already exists.
//
// A claim this engine created without starting the tool (its create was
// stored but the reply was lost, e.g. across a broker restart) is its own
// to use: the tool certainly did not run, so it runs now instead of
// waiting out the lease and being reported uncertain.
func (e *Engine) claimed(ctx context.Context, tc *schemas.TurnContext, tool tools.Tool, call schemas.ToolCall, approvalID string) (*schemas.ToolResult, error) {
	for {
		c, rev, err := e.cfg.Store.Claims.Get(ctx, call.CallID)
		if err != nil {
			return nil, fmt.Errorf("load claim %s: %w", call.CallID, err)
		}
		if c.Result != nil {
			return c.Result, nil
		}
		if _, ran := e.started.Load(call.CallID); c.Worker == e.worker && !ran {
			e.cfg.Logger.Info("resuming own claim whose create reply was lost", "call", call.CallID)
			return e.runClaimed(ctx, tc, tool, call, approvalID, c, rev)
		}
		if age := e.Now().Sub(c.ClaimedAt); age < e.cfg.ClaimLease {
			return nil, fmt.Errorf("call %s claimed by %s %v ago: %w", call.CallID, c.Worker, age.Round(time.Millisecond), ErrClaimHeld)
		}
		if tools.RetrySafe(tool) {
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
		c.Result = e.Result(call, schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain,
			fmt.Sprintf("claimed by %s at %s and no result was recorded; the tool may have run, so it is not run again", c.Worker, c.ClaimedAt.Format(time.RFC3339)), approvalID)
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

// End moves the batch of turnID to a terminal state, unless it already is
// in one, and returns the terminal record. With code == "" the batch
// completes with results (nil entries of results are left as they are in
// the record); otherwise it fails with code and every call without a result
// gets a failed result with that code. Exactly one End wins for a batch.
func (e *Engine) End(ctx context.Context, turnID string, results []*schemas.ToolResult, code schemas.Code, reason string) (*schemas.BatchRecord, error) {
	b, _, err := e.end(ctx, turnID, Known{}, results, code, reason)
	return b, err
}

// Known is what a stage already holds of a turn's records, as it just read
// or wrote them: the batch record at BatchRev, and the session record.
// ConcludeFrom compare-and-sets from them instead of reading each first; a
// record that changed since costs one conflict and a fresh read, so a stale
// Known is never wrong, only slower. The engine takes ownership of the
// records (it modifies them in place). The zero Known holds nothing.
type Known struct {
	Batch    *schemas.BatchRecord
	BatchRev uint64
	Session  *SessionSnapshot
}

// end is End from what k holds, also reporting whether this call made the
// batch terminal.
func (e *Engine) end(ctx context.Context, turnID string, k Known, results []*schemas.ToolResult, code schemas.Code, reason string) (*schemas.BatchRecord, bool, error) {
	reason = clip(reason, MaxReasonBytes)
	ended := false
	cur, rev := k.Batch, k.BatchRev
	if cur == nil || cur.TurnID != turnID {
		cur, rev = nil, 0
	}
	b, _, err := e.cfg.Store.Batches.MutateFrom(ctx, turnID, cur, rev, func(b *schemas.BatchRecord) error {
		ended = false
		if b.State.Terminal() {
			return store.ErrSkip
		}
		ended = true
		for i := range b.Results {
			if i < len(results) && results[i] != nil {
				b.Results[i] = results[i]
			}
		}
		b.State = schemas.BatchCompleted
		if code != "" {
			b.State, b.Code, b.Reason = schemas.BatchFailed, code, reason
			for i, r := range b.Results {
				if r == nil {
					b.Results[i] = e.Result(b.Calls[i], schemas.ResultFailed, code, reason, b.Approvals[i])
				}
			}
		}
		b.UpdatedAt = e.Now()
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("end batch %s: %w", turnID, err)
	}
	return b, ended, nil
}

// Conclude is End followed by Finish, for the stages. When this call is the
// one that made the batch terminal, Finish skips its look-up of an earlier
// outcome: none can exist, and a concurrent publisher of the same outcome
// is within the duplicate window, so the message id dedupes it.
func (e *Engine) Conclude(ctx context.Context, turnID string, results []*schemas.ToolResult, code schemas.Code, reason string) (*schemas.BatchRecord, error) {
	return e.ConcludeFrom(ctx, turnID, Known{}, results, code, reason)
}

// ConcludeFrom is Conclude starting from the records k holds (see Known):
// on the normal path it saves the read of the batch before it ends, and of
// the session before its release.
func (e *Engine) ConcludeFrom(ctx context.Context, turnID string, k Known, results []*schemas.ToolResult, code schemas.Code, reason string) (*schemas.BatchRecord, error) {
	b, ended, err := e.end(ctx, turnID, k, results, code, reason)
	if err != nil {
		return nil, err
	}
	return b, e.finish(ctx, b, !ended, k.Session)
}

// Abort ends the batch of turnID failed with code, unless it is already
// terminal, and finishes it (outcome published, session released). Stages
// call it when they give up on a message that was driving the batch (it is
// about to be dead-lettered), so that every accepted turn still reaches one
// terminal outcome and its session is not held forever. A missing batch is
// not an error: there is nothing to end; nor is a batch that can never be
// ended (a record that does not decode). Any other error is transient, and
// the caller should retry the abort rather than give the message up.
func (e *Engine) Abort(ctx context.Context, turnID string, code schemas.Code, reason string) error {
	if !schemas.ValidKey(turnID) {
		return nil
	}
	end, err := e.Conclude(ctx, turnID, nil, code, reason)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if c := schemas.CodeOf(err); c != "" {
		// The batch cannot be closed at all (e.g. its record does not
		// decode): retrying would not help. Say so; the message is
		// dead-lettered with its own reason.
		e.cfg.Logger.Error("batch cannot be aborted", "turn", turnID, "code", code, "abort_error", c, "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	e.cfg.Logger.Warn("batch aborted", "turn", turnID, "code", code, "state", end.State)
	return nil
}

// TurnOf returns the turn id that a pipeline message names (an accepted
// turn, a turn notice or a decided event), or "" if it names none or does
// not decode. Stages use it to find the batch a message they give up on was
// driving.
func TurnOf(data []byte) string {
	id := ""
	if t, err := schemas.Decode[schemas.AcceptedTurn](data); err == nil {
		id = t.TurnID
	} else if n, err := schemas.Decode[schemas.TurnNotice](data); err == nil {
		id = n.TurnID
	} else if ev, err := schemas.Decode[schemas.DecidedEvent](data); err == nil {
		id = ev.TurnID
	}
	if !schemas.ValidKey(id) {
		return "" // not a turn id Tollgate could have made
	}
	return id
}

// Finish publishes the outcome of a terminal batch and releases its session.
// It is safe to call any number of times: the outcome is published only if
// the events stream does not hold one for the turn yet. The message id
// covers concurrent calls within the duplicate window; the lookup covers a
// repeat after it (a redelivered or re-published trigger, such as an
// identical decision sent again an hour later), which would otherwise tell
// the transport the outcome a second time.
func (e *Engine) Finish(ctx context.Context, b *schemas.BatchRecord) error {
	return e.finish(ctx, b, true, nil)
}

// finish is Finish; lookup says whether an earlier outcome may exist, and
// sess, if not nil, is the session record as the caller last saw it.
func (e *Engine) finish(ctx context.Context, b *schemas.BatchRecord, lookup bool, sess *SessionSnapshot) error {
	if !b.State.Terminal() {
		return fmt.Errorf("finish batch %s: state %s is not terminal", b.TurnID, b.State)
	}
	if b.State == schemas.BatchFailed {
		if err := e.abandonPending(ctx, b); err != nil {
			return err
		}
	}
	subj := topology.EventSubject(topology.SubjectTurnOutcome, b.TurnID)
	stored := false
	if lookup {
		var err error
		if stored, err = e.outcomeStored(ctx, subj); err != nil {
			return err
		}
	}
	if !stored {
		if err := bus.Publish(ctx, e.cfg.JS, subj, "outcome:"+b.TurnID, Outcome(b)); err != nil {
			return err
		}
	}
	return e.release(ctx, b.SessionID, b.TurnID, sess)
}

// abandonPending moves every approval of a failed batch that is still
// pending to abandoned (pending -> abandoned, by compare-and-set) and
// announces it with a decided event, so that no prompt stays open for a
// call that can no longer run and a transport can disable its buttons. The
// event is published by the call that made the change (a crash between the
// two loses only the announcement: the record says abandoned, and the turn's
// failed outcome is still published). An approval record that cannot be
// read is left alone (the approver rejects decisions on it too).
func (e *Engine) abandonPending(ctx context.Context, b *schemas.BatchRecord) error {
	return e.abandon(ctx, b, "tollgate:batch-failed", true)
}

// SupersededPrefix starts the principal recorded on approvals abandoned
// because a newer turn of the session superseded their batch; the
// superseding turn's id follows.
const SupersededPrefix = "tollgate:superseded-by:"

// Supersede abandons the still-pending approvals of b, a batch waiting on
// approvals, because turn newTurnID of the same session superseded it. Each
// is a compare-and-set (pending -> abandoned) announced by a decided event,
// so the redriver completes b with results that say so and the session
// moves on. Approvals already decided are untouched: a batch whose barrier
// is already met runs as approved.
func (e *Engine) Supersede(ctx context.Context, b *schemas.BatchRecord, newTurnID string) error {
	return e.abandon(ctx, b, SupersededPrefix+newTurnID, false)
}

// abandon moves b's pending approvals to abandoned under principal. With
// unrecorded, it also looks for approvals the batch never recorded.
func (e *Engine) abandon(ctx context.Context, b *schemas.BatchRecord, principal string, unrecorded bool) error {
	for i, id := range b.Approvals {
		if id == "" && !unrecorded {
			continue
		}
		if id == "" {
			// The batch may have failed before it recorded an approval the
			// executor had already created (and announced): look by the id
			// the call's approval would have (this is the failure path only).
			id = schemas.ApprovalID(b.TurnID, i)
		}
		changed := false
		rec, _, err := e.cfg.Store.Approvals.Mutate(ctx, id, func(a *schemas.ApprovalRecord) error {
			changed = false
			if a.Status != schemas.ApprovalPending {
				return store.ErrSkip
			}
			changed = true
			a.Status = schemas.ApprovalAbandoned
			a.Decision = &schemas.DecisionInfo{Principal: principal, DecidedAt: e.Now()}
			return nil
		})
		switch {
		case errors.Is(err, store.ErrNotFound) || schemas.CodeOf(err) != "":
			continue
		case err != nil:
			return fmt.Errorf("abandon %s: %w", id, err)
		}
		if !changed {
			continue // already decided; or abandoned and announced by an earlier finish
		}
		e.cfg.Logger.Info("approval abandoned", "approval", id, "turn", b.TurnID, "by", principal)
		ev := &schemas.DecidedEvent{ApprovalID: id, TurnID: rec.TurnID, SessionID: rec.SessionID, Status: rec.Status, Decision: rec.Decision, At: rec.Decision.DecidedAt, Votes: rec.Votes}
		if err := bus.Publish(ctx, e.cfg.JS, topology.EventSubject(topology.SubjectApprovalDecided, b.TurnID), "decided:"+id, ev); err != nil {
			return err
		}
	}
	return nil
}

// outcomeStored reports whether the events stream holds a message on subject.
func (e *Engine) outcomeStored(ctx context.Context, subject string) (bool, error) {
	e.mu.Lock()
	s := e.events
	e.mu.Unlock()
	if s == nil {
		var err error
		if s, err = e.cfg.JS.Stream(ctx, topology.StreamEvents); err != nil {
			return false, fmt.Errorf("look up %s: %w", subject, err)
		}
		e.mu.Lock()
		e.events = s
		e.mu.Unlock()
	}
	_, err := s.GetLastMsgForSubject(ctx, subject)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("look up %s: %w", subject, err)
	}
}

// Outcome is the turn outcome of a terminal batch. The reply target and
// audience come from the batch's own TurnContext; with no context there is
// no reply target and no audience.
func Outcome(b *schemas.BatchRecord) *schemas.TurnOutcome {
	o := &schemas.TurnOutcome{
		TurnID: b.TurnID, SessionID: b.SessionID, State: schemas.TurnCompleted,
		Code: b.Code, Reason: b.Reason, FinishedAt: b.UpdatedAt,
	}
	if b.State == schemas.BatchFailed {
		o.State = schemas.TurnFailed
	}
	for _, r := range b.Results {
		if r != nil {
			o.Results = append(o.Results, *r)
		}
	}
	if b.Context != nil {
		o.Reply = schemas.ReplyTarget{Transport: b.Context.Transport, Channel: b.Context.Channel}
		o.Audience = b.Context.Audience
	}
	return o
}

// Acquire makes turnID the active turn of its session if the session is
// free, or queues it behind the active one (once). It reports whether
// turnID is now active. inboundSeq, if not zero, is the turn's inbound
// stream sequence: the session's arrival watermark (SessionRecord.InboundSeq)
// is raised to it in the same compare-and-set. The caller has checked that
// every earlier inbound message of the session is settled (the executor's
// order.go), so queue order is arrival order. snap, if not nil, is the
// session record as the caller just read it, used instead of a first read
// (an empty snapshot: nothing read yet); Acquire leaves in it the session
// record as it last read or wrote it, for ConcludeFrom's release.
func (e *Engine) Acquire(ctx context.Context, sessionID, turnID string, inboundSeq uint64, snap *SessionSnapshot) (bool, error) {
	key := schemas.SessionKey(sessionID)
	out := snap
	for {
		cur, rev, err := snap.take()
		snap = nil // a conflict means it is stale: read again
		if cur == nil && err == nil {
			cur, rev, err = e.cfg.Store.Sessions.Get(ctx, key)
		}
		if errors.Is(err, store.ErrNotFound) {
			rec := &schemas.SessionRecord{SessionID: sessionID, Active: turnID, InboundSeq: inboundSeq, UpdatedAt: e.Now()}
			var n uint64
			n, err = e.cfg.Store.Sessions.Create(ctx, key, rec)
			if err == nil {
				out.set(rec, n)
				return true, nil
			}
			if errors.Is(err, store.ErrExists) {
				continue // created meanwhile: read it
			}
		}
		if err != nil {
			return false, fmt.Errorf("acquire session %s: %w", key, err)
		}
		active, write := e.enqueue(cur, turnID, inboundSeq)
		if !write {
			out.set(cur, rev)
			return active, nil
		}
		n, err := e.cfg.Store.Sessions.Update(ctx, key, cur, rev)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("acquire session %s: %w", key, err)
		}
		out.set(cur, n)
		return active, nil
	}
}

// SessionSnapshot is a session record as its caller just read it, handed
// to Acquire so that it does not read it again: Rec at revision Rev, or
// NotFound when the key did not exist. A stale snapshot costs one
// compare-and-set conflict and a fresh read.
type SessionSnapshot struct {
	Rec      *schemas.SessionRecord
	Rev      uint64
	NotFound bool
}

// set makes s (if not nil) the record rec at revision rev.
func (s *SessionSnapshot) set(rec *schemas.SessionRecord, rev uint64) {
	if s != nil {
		*s = SessionSnapshot{Rec: rec, Rev: rev}
	}
}

// take returns the snapshot as Acquire's first read: the record, or
// store.ErrNotFound, or nothing (nil, 0, nil) for a nil snapshot.
func (s *SessionSnapshot) take() (*schemas.SessionRecord, uint64, error) {
	switch {
	case s == nil:
		return nil, 0, nil
	case s.NotFound:
		return nil, 0, store.ErrNotFound
	}
	return s.Rec, s.Rev, nil
}

// enqueue applies Acquire's change to session record s: turnID becomes
// active if the session is free, or joins the queue once; the arrival
// watermark rises to inboundSeq. It reports whether turnID is active and
// whether s changed (must be written).
func (e *Engine) enqueue(s *schemas.SessionRecord, turnID string, inboundSeq uint64) (active, write bool) {
	raise := inboundSeq > s.InboundSeq
	if raise {
		s.InboundSeq = inboundSeq
	}
	write = true
	switch {
	case s.Active == turnID:
		active, write = true, raise
	case s.Active == "":
		active = true
		s.Active = turnID
		s.Queue = slices.DeleteFunc(s.Queue, func(t string) bool { return t == turnID })
	case slices.Contains(s.Queue, turnID):
		write = raise
	default:
		s.Queue = append(s.Queue, turnID)
	}
	if write {
		s.UpdatedAt = e.Now()
	}
	return active, write
}

// Announce publishes the ready notice of turnID (message id "ready:" +
// turnID), on which an executor advances its batch: a queued turn that is
// now its session's active one, or (from the recovery sweep) a running
// batch whose executor died.
func (e *Engine) Announce(ctx context.Context, sessionID, turnID string) error {
	n := &schemas.TurnNotice{TurnID: turnID, SessionID: sessionID, Kind: schemas.NoticeReady, At: e.Now()}
	return bus.Publish(ctx, e.cfg.JS, topology.ReadySubject(schemas.SessionKey(sessionID)), "ready:"+turnID, n)
}

// ClaimLease is how long an execution claim without a result is honoured
// before the call is reported uncertain.
func (e *Engine) ClaimLease() time.Duration { return e.cfg.ClaimLease }

// Release ends turnID's hold on its session: the next queued turn becomes
// active and is announced on the ready subject. If turnID no longer holds the
// session (a repeated Release), the currently active turn is announced again
// if it is still queued, so a crash between the two steps loses nothing.
// Release with turnID "" is the recovery sweep's: it promotes the first
// queued turn of a session that has none active, or re-announces the
// active one, and changes nothing otherwise.
func (e *Engine) Release(ctx context.Context, sessionID, turnID string) error {
	return e.release(ctx, sessionID, turnID, nil)
}

// release is Release, starting from snap (if it holds the record) instead
// of a first read.
func (e *Engine) release(ctx context.Context, sessionID, turnID string, snap *SessionSnapshot) error {
	key := schemas.SessionKey(sessionID)
	for {
		var cur *schemas.SessionRecord
		var rev uint64
		// Only a snapshot in which turnID holds the session: the function
		// below skips (writes nothing, checks nothing) when it does not,
		// and a stale snapshot must only ever cost a conflict.
		if snap != nil && snap.Rec != nil && snap.Rec.SessionID == sessionID && snap.Rec.Active == turnID && turnID != "" {
			cur, rev = snap.Rec, snap.Rev
		}
		snap = nil
		s, _, err := e.cfg.Store.Sessions.MutateFrom(ctx, key, cur, rev, func(s *schemas.SessionRecord) error {
			if s.Active != turnID || (s.Active == "" && len(s.Queue) == 0) {
				return store.ErrSkip
			}
			s.Active = ""
			if len(s.Queue) > 0 {
				s.Active, s.Queue = s.Queue[0], s.Queue[1:]
			}
			s.UpdatedAt = e.Now()
			return nil
		})
		if errors.Is(err, store.ErrNotFound) {
			return nil // the turn never held the session
		}
		if err != nil {
			return fmt.Errorf("release session %s: %w", key, err)
		}
		next := s.Active
		if next == "" || next == turnID {
			return nil
		}
		nb, _, err := e.cfg.Store.Batches.Get(ctx, next)
		if errors.Is(err, store.ErrNotFound) {
			// Queued by an executor that has not written it yet cannot happen
			// (the batch is created before it is queued); a missing record
			// means it was removed: skip it.
			turnID = next
			continue
		}
		if err != nil {
			return fmt.Errorf("release session %s: load next %s: %w", key, next, err)
		}
		switch {
		case nb.State.Terminal():
			turnID = next // it ended while queued: pass the session on
			continue
		case nb.State == schemas.BatchQueued:
			return e.Announce(ctx, sessionID, next)
		default:
			return nil // already running
		}
	}
}
