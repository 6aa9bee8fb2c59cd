package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

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
// or wrote them: the batch record at BatchRev.
// ConcludeFrom compare-and-sets from them instead of reading each first; a
// record that changed since costs one conflict and a fresh read, so a stale
// Known is never wrong, only slower. The engine takes ownership of the
// records (it modifies them in place). The zero Known holds nothing.
type Known struct {
	Batch    *schemas.BatchRecord
	BatchRev uint64
	// Retained are approvals of the batch whose retention the stage saw
	// started: it read the revision that decided each, written with the
	// bucket's TTL (store.Decision.Retained). The batch's end does not
	// read them again to retire them (Finish). Only what the stage read
	// belongs here: a wrong entry would leave an approval without its TTL.
	Retained []string
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
		if err := e.MayEnd(ctx, b); err != nil {
			return err // a batch ends only in its turn (order.go)
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
				switch c := b.ClaimOf(i); {
				case r != nil:
				case c != nil:
					// Claimed and no result (its run was cut short): the
					// tool may have run, which failed would deny.
					b.Results[i] = e.Result(b.Calls[i], schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain,
						fmt.Sprintf("the batch failed (%s) while the call was claimed by %s at %s with no result recorded; the tool may have run", code, c.Worker, c.ClaimedAt.Format(time.RFC3339)), b.Approvals[i])
				default:
					b.Results[i] = e.Result(b.Calls[i], schemas.ResultFailed, code, reason, b.Approvals[i])
				}
			}
		}
		b.UpdatedAt = e.Now()
		if !b.Bucketed() {
			// The turn's outcome is part of the write that ends it (the
			// log's outcome event): readers take it from there.
			b.Outcome = Outcome(e.cfg.Keys, b)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("end batch %s: %w", turnID, err)
	}
	if ended {
		e.recent.add(turnID, b.OrderSeq)
		e.ended.WithLabelValues(string(b.State)).Inc()
		for _, r := range b.Results {
			if r != nil {
				e.results.WithLabelValues(string(r.Status), string(r.Code)).Inc()
			}
		}
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
// on the normal path it saves the read of the batch before it ends. (The
// session's release reads the session record itself: see Release.)
func (e *Engine) ConcludeFrom(ctx context.Context, turnID string, k Known, results []*schemas.ToolResult, code schemas.Code, reason string) (*schemas.BatchRecord, error) {
	b, ended, err := e.end(ctx, turnID, k, results, code, reason)
	if err != nil {
		return nil, err
	}
	return b, e.finish(ctx, b, !ended, k.Retained)
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
	if errors.Is(err, ErrNotItsTurn) {
		// A queued batch whose turn has not come is not ended out of
		// turn: it stays queued, and its predecessor's end announces it
		// (it then runs, or fails on its own checks).
		e.cfg.Logger.Warn("batch not aborted: it waits for its turn", "turn", turnID, "code", code)
		return nil
	}
	if schemas.Permanent(err) {
		// The batch cannot be closed at all (e.g. its record does not
		// decode): retrying would not help. Say so; the message is
		// dead-lettered with its own reason.
		e.cfg.Logger.Error("batch cannot be aborted", "turn", turnID, "code", code, "abort_error", schemas.CodeOf(err), "err", err)
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
	} else if a, err := schemas.Decode[schemas.ApprovalRecord](data); err == nil {
		id = a.TurnID // a revision of the approvals bucket (the redriver's trigger)
	}
	if !schemas.ValidKey(id) {
		return "" // not a turn id Tollgate could have made
	}
	return id
}

// Finish finishes a terminal batch: a failed batch's pending approvals are
// abandoned (announced), its approvals' and claims' retention is started
// (retire), the turn's outcome is announced where its ending write did not
// keep it, and an earlier version's batch releases its session record
// (Release). A batch with a place reads nothing for its session: the
// turn queued after it is woken by the redriver's watch of its terminal
// write (Wake, order.go).
//
// A batch ended in its turn log keeps its outcome in that write (the log's
// outcome event, schemas.BatchRecord.Outcome): that event is the outcome,
// which readers follow (pipeline/outcomes, docs/protocol.md §4.2a), and
// Finish publishes nothing. Only a batch kept in tollgate_batches, or one an
// earlier version ended without keeping its outcome, gets its outcome
// published on tollgate.event.turn.outcome.<turn>, once: only if the events
// stream does not hold one for the turn yet (the message id covers
// concurrent calls within the duplicate window; the lookup a repeat after
// it, such as an identical decision sent again an hour later).
//
// It is safe to call any number of times, and a crash at any point of it
// is made good by the Finish of a redelivered trigger.
func (e *Engine) Finish(ctx context.Context, b *schemas.BatchRecord) error {
	return e.finish(ctx, b, true, nil)
}

// finish is Finish; lookup says whether an earlier published outcome may
// exist; retained are approvals whose retention has started (Known).
func (e *Engine) finish(ctx context.Context, b *schemas.BatchRecord, lookup bool, retained []string) error {
	if !b.State.Terminal() {
		return fmt.Errorf("finish batch %s: state %s is not terminal", b.TurnID, b.State)
	}
	if b.State == schemas.BatchFailed {
		if err := e.abandonPending(ctx, b); err != nil {
			return err
		}
	}
	if err := e.announce(ctx, b, lookup, retained); err != nil {
		return err
	}
	if b.HeldBy != "" {
		// A step of an agent loop ran inside its loop's hold on the session
		// and never took the session itself: there is nothing to release.
		return nil
	}
	if b.OrderSeq == 0 || b.OrderAfter == "" {
		// A batch without a place held the session record (an earlier
		// version's turn); a session's first entry may have joined the
		// record's queue behind one (ItsTurn). Release writes only when
		// the record names this turn with turns queued behind it.
		if err := e.release(ctx, SessionOf(b.Context), b.TurnID, false); err != nil {
			return err
		}
	}
	// A batch with a place wakes the turn after it by its terminal write
	// alone: the redriver's watch of the turn logs delivers it (Wake,
	// order.go).
	return nil
}

// announce retires b's records and, for a batch whose ending write did not
// keep its outcome, publishes the outcome (see Finish).
func (e *Engine) announce(ctx context.Context, b *schemas.BatchRecord, lookup bool, retained []string) error {
	if b.Outcome != nil && !b.Bucketed() {
		// The turn log's outcome event holds it: written once, read there.
		// Retiring is cheap to repeat (a read for a record retired
		// already), so every Finish does it.
		return e.retire(ctx, b, retained)
	}
	subj := topology.EventSubject(topology.SubjectTurnOutcome, b.TurnID)
	if lookup {
		stored, err := e.outcomeStored(ctx, subj)
		if err != nil || stored {
			return err
		}
	}
	if err := e.retire(ctx, b, retained); err != nil {
		return err
	}
	return bus.Publish(ctx, e.cfg.JS, subj, topology.OutcomeMsgID(b.TurnID), Outcome(e.cfg.Keys, b))
}

// retire makes sure the approvals and execution claims of b, a terminal
// batch, have their retention started (store.Bucket.Retire; nothing when
// the store keeps every record). Most already have it: a claim's starts
// with its result's write, an approval's with its decision's, and for
// those retire is a read. It writes the others: a claim left without a
// result (its batch aborted), and records an earlier version ended
// without a TTL. From now on the terminal batch record answers every
// trigger of the turn, and it leaves KV no earlier than they do (it was
// written terminal, with the same TTL, after them). A failed batch's
// approvals include those it never recorded, as abandonPending finds
// them. Where Finish publishes the outcome, it runs before, so that a
// crash in between is made good by the Finish of a redelivered trigger,
// which finds no outcome yet; a Finish after that outcome does not look at
// them again. Where the turn log keeps the outcome, every Finish runs it.
// An approval in retained (Known.Retained) is not read: the stage saw the
// write that started its retention (the redriver, the decision it was
// triggered by).
func (e *Engine) retire(ctx context.Context, b *schemas.BatchRecord, retained []string) error {
	for i, call := range b.Calls {
		id := b.Approvals[i]
		if id == "" && b.State == schemas.BatchFailed {
			id = schemas.ApprovalID(b.TurnID, i)
		}
		if id != "" && !slices.Contains(retained, id) {
			if err := e.cfg.Store.Approvals.Retire(ctx, id); err != nil {
				return err
			}
		}
		if !b.Legacy() {
			continue // its claims are in the record itself
		}
		if err := e.cfg.Store.Claims.Retire(ctx, call.CallID); err != nil {
			return err
		}
	}
	return nil
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

// SupersedeActive applies the session policy "supersede" for newTurnID,
// just queued in session sess: the session's active turn gives way.
// A batch waiting on approvals has them abandoned (Supersede). A planner
// turn's loop (BatchRecord.Plan) is marked superseded on its batch record
// (SupersededBy, by compare-and-set: it takes no further model step and
// fails TURN_SUPERSEDED), and the step batch it waits on, if that waits on
// approvals, has them abandoned. Anything else (a running batch, an ended
// one, no active turn) is left to end by itself: newTurnID runs after it.
// Records that are gone or do not decode are not superseded (their own
// stages fail closed on them).
func (e *Engine) SupersedeActive(ctx context.Context, sess Session, newTurnID string) error {
	s, _, err := e.cfg.Store.Sessions.Get(ctx, sess.Key)
	if err != nil || s.Active == "" || s.Active == newTurnID {
		return ignoreGone(err)
	}
	old, _, err := e.cfg.Store.Batches.Get(ctx, s.Active)
	if err != nil {
		return ignoreGone(err)
	}
	if !old.Plan {
		if old.State != schemas.BatchAwaiting {
			return nil // not waiting on anyone: the new turn runs when it ends
		}
		e.cfg.Logger.Info("turn supersedes its session's waiting batch", "turn", newTurnID, "superseded", old.TurnID)
		return e.Supersede(ctx, old, newTurnID)
	}
	return e.SupersedeLoop(ctx, old.TurnID, newTurnID)
}

// SupersedeLoop marks the agent loop of planner turn loopID superseded by
// newTurnID (see SupersedeActive) and abandons the approvals its latest
// step batch waits on. It is idempotent.
func (e *Engine) SupersedeLoop(ctx context.Context, loopID, newTurnID string) error {
	_, _, err := e.cfg.Store.Batches.Mutate(ctx, loopID, func(b *schemas.BatchRecord) error {
		if !b.Plan || b.State.Terminal() || b.SupersededBy != "" {
			return store.ErrSkip
		}
		b.SupersededBy, b.UpdatedAt = newTurnID, e.Now()
		return nil
	})
	if err != nil {
		return ignoreGone(err)
	}
	e.cfg.Logger.Info("turn supersedes its session's agent loop", "turn", newTurnID, "superseded", loopID)
	// The loop's step batches are loopID-p0, -p1, ...; a step whose calls
	// were all malformed has none, so there can be gaps. Only the latest
	// step can still be running or waiting: the first batch found not
	// terminal is it. The probe gives up after maxStepGap missing steps in
	// a row. A step that starts waiting after the mark above abandons its
	// own approvals (the executor's supersedeSelf), so a step this probe
	// misses is one not waiting yet.
	for n, missing := 0, 0; missing < maxStepGap; n++ {
		st, _, err := e.cfg.Store.Batches.Get(ctx, schemas.PlannerStepTurnID(loopID, n))
		switch {
		case errors.Is(err, store.ErrNotFound):
			missing++
			continue
		case err != nil:
			return ignoreGone(err)
		}
		missing = 0
		if !st.State.Terminal() {
			if st.State != schemas.BatchAwaiting {
				return nil // running: the loop stops at its next step
			}
			return e.Supersede(ctx, st, newTurnID)
		}
	}
	return nil // between steps: the loop stops at its next step
}

// maxStepGap is how many missing step batches in a row end
// SupersedeLoop's probe.
const maxStepGap = 8

// ignoreGone drops the errors under which superseding is simply not
// possible: no record, or one that does not decode.
func ignoreGone(err error) error {
	if errors.Is(err, store.ErrNotFound) || schemas.Permanent(err) {
		return nil
	}
	return err
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
		case errors.Is(err, store.ErrNotFound) || schemas.Permanent(err):
			continue
		case err != nil:
			return fmt.Errorf("abandon %s: %w", id, err)
		}
		if !changed {
			continue // already decided; or abandoned and announced by an earlier finish
		}
		// The abandoned record's revision is its decided event.
		e.cfg.Logger.Info("approval abandoned", "approval", id, "turn", b.TurnID, "by", principal, "status", rec.Status)
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
	return bus.Stored(ctx, s, subject)
}

// Outcome is the turn outcome of a terminal batch, and the only builder of
// one: every outcome the stages publish comes from here (through Finish).
//
// Its reply target and audience come only from a TurnContext that Authorize
// accepts with keys: sealed by a key of the ring and captured for b's turn
// (or for the turn that scheduled b as follow-up work). A batch whose
// context is missing, unsealed, edited, sealed with an unknown key or
// another turn's gets an outcome that goes nowhere: no reply target,
// audience "", and no results (they may be results of calls that ran for the
// real requester, which an edited context would otherwise send elsewhere).
// It carries the batch's failure code, or, for a batch that completed and
// whose context was edited since, the code of the context's failure.
func Outcome(keys *seal.KeyRing, b *schemas.BatchRecord) *schemas.TurnOutcome {
	o := &schemas.TurnOutcome{
		V:      schemas.TurnOutcomeVersion,
		TurnID: b.TurnID, SessionID: b.SessionID, State: schemas.TurnCompleted,
		Code: b.Code, Reason: b.Reason, FinishedAt: b.UpdatedAt,
	}
	if b.State == schemas.BatchFailed {
		o.State = schemas.TurnFailed
	}
	if err := Authorize(keys, b); err != nil {
		if o.Code == "" {
			o.Code, o.Reason = schemas.CodeOf(err), clip(schemas.ReasonOf(err), MaxReasonBytes) // Authorize's errors are all coded
		}
		return o
	}
	for _, r := range b.Results {
		if r != nil {
			o.Results = append(o.Results, *r)
		}
	}
	o.Reply = schemas.ReplyTarget{Transport: b.Context.Transport, Channel: b.Context.Channel}
	o.Audience = b.Context.Audience
	return o
}
