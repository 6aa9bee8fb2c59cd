package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// ScheduleFollowUp implements tools.Scheduler. The follow-up is an accepted
// turn with id schemas.FollowUpTurnID(from.CallID), whose Context is
// from.Context exactly as the submitting turn persisted it (inherited
// authority: it must still verify, and the executor checks it like any
// other), Origin from.CallID, FollowUpDepth one more than the calling
// turn's (read from its batch record, never counted from ids), NotBefore
// now plus delay, and one call.
//
// It is always published as a message schedule on
// topology.SubjectTurnSchedule, whatever the delay (a zero delay too), that
// the server publishes on the session's accepted subject when due. The
// schedule's time is NotBefore rounded up to the next whole second (the
// "@at" time has whole seconds), so the server never fires it before
// NotBefore, and the executor does not start a turn before its NotBefore
// in any case. Stages therefore never publish accepted turns themselves,
// which keeps that subject ingest's alone under
// deploy/nats/least-privilege.conf. The publish carries a message id, and
// the executor creates the batch by KV create, so a repeated call schedules
// once.
//
// It fails with FOLLOWUP_REJECTED, and schedules nothing, when the context
// does not verify, the call cannot start follow-up work of its turn, tool
// is not a valid tool name (schemas.CheckToolName), args is not a JSON
// object, delay is outside 0 to tools.MaxFollowUpDelay, or the chain would
// be deeper than schemas.MaxFollowUpDepth. Any other error (reading the
// calling turn's batch, publishing) is transient.
func (e *Engine) ScheduleFollowUp(ctx context.Context, from tools.Call, tool, args string, delay time.Duration) (string, error) {
	reject := func(format string, a ...any) (string, error) {
		return "", schemas.Errorf(schemas.CodeFollowUpRejected, format, a...)
	}
	tc := from.Context
	if err := e.cfg.Keys.Verify(tc); err != nil {
		return reject("the submitting turn's context does not verify: %v", err)
	}
	turnID := schemas.FollowUpTurnID(from.CallID)
	parentID := schemas.TurnIDOfCall(from.CallID)
	if err := tc.CheckFor(turnID); err != nil || !schemas.ValidKey(turnID) || parentID == "" {
		return reject("call %s cannot start follow-up work under turn %s", from.CallID, tc.TurnID)
	}
	if err := schemas.CheckToolName(tool); err != nil {
		return reject("%v", err)
	}
	canon, digest, err := schemas.CanonicalArgs(args)
	if err != nil {
		return reject("follow-up args: %v", err)
	}
	if delay < 0 || delay > tools.MaxFollowUpDelay {
		return reject("delay %v: want 0s to %v", delay, tools.MaxFollowUpDelay)
	}
	parent, _, err := e.cfg.Store.Batches.Get(ctx, parentID)
	switch {
	case errors.Is(err, store.ErrNotFound) || schemas.Permanent(err):
		return reject("the batch of turn %s, whose call %s schedules it, cannot be read: %v", parentID, from.CallID, err)
	case err != nil:
		return "", fmt.Errorf("schedule follow-up %s: %w", turnID, err)
	case !slices.ContainsFunc(parent.Calls, func(c schemas.ToolCall) bool { return c.CallID == from.CallID }):
		return reject("turn %s has no call %s", parentID, from.CallID)
	}
	depth := parent.FollowUpDepth + 1
	if depth > schemas.MaxFollowUpDepth {
		return reject("follow-up chain of depth %d exceeds %d", depth, schemas.MaxFollowUpDepth)
	}
	now := e.Now()
	t := &schemas.AcceptedTurn{
		TurnID: turnID, Context: tc, Text: "follow-up of " + from.CallID,
		Calls:      []schemas.ToolCall{{CallID: schemas.CallID(turnID, 0), Index: 0, Tool: tool, Args: canon, ArgsDigest: digest}},
		AcceptedAt: now, Origin: from.CallID, NotBefore: now.Add(delay), FollowUpDepth: depth,
	}
	target := topology.AcceptedSubject(schemas.SessionKeyOf(tc))
	data, err := schemas.Encode(t)
	if err != nil {
		return reject("%v", err)
	}
	hdr := nats.Header{}
	hdr.Set("Nats-Schedule", scheduleAt(t.NotBefore))
	hdr.Set("Nats-Schedule-Target", target)
	if err := bus.PublishRaw(ctx, e.cfg.JS, topology.SubjectTurnSchedule+turnID, topology.ScheduleMsgID(turnID), data, hdr); err != nil {
		return "", fmt.Errorf("schedule follow-up %s: %w", turnID, err)
	}
	e.cfg.Logger.Info("follow-up scheduled", "turn", turnID, "origin", from.CallID, "tool", tool, "due", t.NotBefore, "depth", depth)
	return turnID, nil
}

// scheduleAt is the Nats-Schedule header value of a message schedule due
// at notBefore: "@at " and notBefore in RFC 3339 UTC, rounded up to the
// next whole second when it has a fraction, so that the schedule never
// fires before notBefore.
func scheduleAt(notBefore time.Time) string {
	at := notBefore.UTC().Truncate(time.Second)
	if at.Before(notBefore) {
		at = at.Add(time.Second)
	}
	return "@at " + at.Format(time.RFC3339)
}
