package executor_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
)

// A step batch of an agent loop that comes after its loop has ended finds
// the session record still naming the loop (a turn's end writes nothing
// to a session with no turn queued). The loop's hold is over: the step
// takes the session like any follow-up, and does not run "inside" a hold
// that no longer exists, beside a turn that took the free session.
func TestAStepAfterItsLoopEndedTakesTheSession(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	const session = "late-step"
	loop := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"the loop"}`)))
	ended, _ := h.WaitTerminal(loop)
	if s := h.Session(session); s == nil || s.Active != loop {
		t.Fatalf("session %+v, want it still naming the ended %s", s, loop)
	}

	step := schemas.PlannerStepTurnID(loop, 0)
	b := &schemas.BatchRecord{
		TurnID: step, SessionID: ended.SessionID, Context: ended.Context, Origin: loop,
		State: schemas.BatchQueued, UpdatedAt: ended.UpdatedAt,
	}
	for i, c := range ended.Calls {
		c.CallID = schemas.CallID(step, i)
		b.Calls = append(b.Calls, c)
	}
	b.Approvals, b.Results = make([]string, len(b.Calls)), make([]*schemas.ToolResult, len(b.Calls))
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := h.Store.Batches.Create(ctx, step, b); err != nil {
		t.Fatal(err)
	}
	key := schemas.SessionKeyOf(ended.Context)
	h.Publish(topology.ReadySubject(key), topology.ReadyMsgID(step),
		&schemas.TurnNotice{TurnID: step, SessionID: ended.SessionID, Kind: schemas.NoticeReady, At: ended.UpdatedAt})

	got, out := h.WaitTerminal(step)
	if out.State != schemas.TurnCompleted || got.Results[0].Output != "the loop" {
		t.Fatalf("step outcome %s, result %+v", out.State, got.Results[0])
	}
	if got.HeldBy != "" {
		t.Fatalf("the step ran inside the hold of %q, a loop that had ended", got.HeldBy)
	}
	if s := h.Session(session); s == nil || s.Active != step {
		t.Fatalf("session %+v, want the step to have taken it", s)
	}
}
