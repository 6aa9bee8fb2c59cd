package executor_test

import (
	"slices"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
)

// A step batch of an agent loop that comes after its loop has ended finds
// no hold to run inside: it joins its session's order (one entry more,
// after the loop's) and runs there like any turn, never "inside" a hold
// that no longer exists, beside a turn that came after the loop.
func TestAStepAfterItsLoopEndedJoinsTheSessionsOrder(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: testPolicy})
	const session = "late-step"
	loop := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"the loop"}`)))
	ended, _ := h.WaitTerminal(loop)

	step := schemas.PlannerStepTurnID(loop, 0)
	at := &schemas.AcceptedTurn{TurnID: step, Context: ended.Context, Origin: loop, FollowUpDepth: 1}
	for i, c := range ended.Calls {
		c.CallID = schemas.CallID(step, i)
		at.Calls = append(at.Calls, c)
	}
	key := schemas.SessionKeyOf(ended.Context)
	h.Publish(topology.AcceptedSubject(key), step, at)

	got, out := h.WaitTerminal(step)
	if out.State != schemas.TurnCompleted || got.Results[0].Output != "the loop" {
		t.Fatalf("step outcome %s, result %+v", out.State, got.Results[0])
	}
	if got.HeldBy != "" {
		t.Fatalf("the step ran inside the hold of %q, a loop that had ended", got.HeldBy)
	}
	if got.OrderSeq == 0 || got.OrderAfter != loop {
		t.Fatalf("the step's place is %d after %q, want an entry after the loop %s", got.OrderSeq, got.OrderAfter, loop)
	}
	if order := h.Order(session); !slices.Equal(order, []string{loop, step}) {
		t.Fatalf("the session's order is %v, want [%s %s]", order, loop, step)
	}
	if s := h.Session(session); s != nil {
		t.Fatalf("a session record was written: %+v", s)
	}
}
