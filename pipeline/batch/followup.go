package batch

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// ScheduleFollowUp implements tools.Scheduler. The follow-up is an accepted
// turn with id schemas.FollowUpTurnID(from.CallID), whose Context is
// from.Context exactly as the submitting turn persisted it (inherited
// authority: it must still verify, and the executor checks it like any
// other), Origin from.CallID and one call. It is always published as a
// message schedule on topology.SubjectTurnSchedule that the server
// publishes on the session's accepted subject when due (a due time already
// past fires on the server's next scheduler pass). Stages therefore never
// publish accepted turns themselves, which keeps that subject ingest's
// alone under deploy/nats/least-privilege.conf. The publish carries a
// message id, and the executor creates the batch by KV create, so a
// repeated call schedules once.
//
// It fails with FOLLOWUP_REJECTED when the context does not verify, the
// chain is deeper than schemas.MaxFollowUpDepth, or the call is not valid.
func (e *Engine) ScheduleFollowUp(ctx context.Context, from tools.Call, tool, args string, delay time.Duration) (string, error) {
	reject := func(format string, a ...any) (string, error) {
		return "", schemas.Errorf(schemas.CodeFollowUpRejected, format, a...)
	}
	tc := from.Context
	if err := e.cfg.Keys.Verify(tc); err != nil {
		return reject("the submitting turn's context does not verify: %v", err)
	}
	turnID := schemas.FollowUpTurnID(from.CallID)
	if err := tc.CheckFor(turnID); err != nil || !schemas.ValidKey(turnID) {
		return reject("call %s cannot start follow-up work under turn %s", from.CallID, tc.TurnID)
	}
	if d := schemas.FollowUpDepth(turnID); d > schemas.MaxFollowUpDepth {
		return reject("follow-up chain of depth %d exceeds %d", d, schemas.MaxFollowUpDepth)
	}
	canon, digest, err := schemas.CanonicalArgs(args)
	if err != nil {
		return reject("follow-up args: %v", err)
	}
	now := e.Now()
	t := &schemas.AcceptedTurn{
		TurnID: turnID, Context: tc, Text: "follow-up of " + from.CallID,
		Calls:      []schemas.ToolCall{{CallID: schemas.CallID(turnID, 0), Index: 0, Tool: tool, Args: canon, ArgsDigest: digest}},
		AcceptedAt: now, Origin: from.CallID, NotBefore: now.Add(delay),
	}
	target := topology.AcceptedSubject(schemas.SessionKey(tc.SessionID))
	data, err := schemas.Encode(t)
	if err != nil {
		return reject("%v", err)
	}
	hdr := nats.Header{}
	hdr.Set("Nats-Schedule", "@at "+t.NotBefore.UTC().Format(time.RFC3339))
	hdr.Set("Nats-Schedule-Target", target)
	if err := bus.PublishRaw(ctx, e.cfg.JS, topology.SubjectTurnSchedule+turnID, "schedule:"+turnID, data, hdr); err != nil {
		return "", fmt.Errorf("schedule follow-up %s: %w", turnID, err)
	}
	e.cfg.Logger.Info("follow-up scheduled", "turn", turnID, "origin", from.CallID, "tool", tool, "due", t.NotBefore)
	return turnID, nil
}
