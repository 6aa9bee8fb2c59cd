package batch_test

import (
	"errors"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// retentionPolicy: "auto" runs at once, "guarded" needs the requester's
// approval.
const retentionPolicy = `{
  "version": "retention-test",
  "tools": {"auto": {"approval": "never"}, "guarded": {"approval": "required"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// A claim's retention starts when its result is written: the batch record
// takes the result over in the same step, so nothing that drives the
// batch, however long it waits for an approval, needs the claim again. A
// redelivered accepted message finds the batch record (it leaves KV a
// retention after the batch ends, and the streams keep messages no longer
// than that: tollgate.Config.Validate) and runs nothing; a run resumed
// after the retention does not run a call with no claim
// (TestAResumedRunAfterTheRetentionRunsNoClaimlessCall).
func TestClaimsOutliveEveryMessageThatCouldRunTheirCall(t *testing.T) {
	// Long enough that the accepted message, kept no longer than the
	// retention, is still there to be read after the approval is pending
	// on a loaded machine.
	const retention = 5 * time.Second
	auto, guarded := &pt.Counter{ToolName: "auto"}, &pt.Counter{ToolName: "guarded"}
	h := pt.Start(t, pt.Options{Policy: retentionPolicy, Tools: []tools.Tool{auto, guarded}, Retention: retention})
	claim := func(callID string) error {
		ctx, cancel := h.Ctx()
		defer cancel()
		_, _, err := h.Store.Claims.Get(ctx, callID)
		return err
	}

	turn := h.Send(h.Inbound("waits", "alice", pt.Call("auto", `{}`), pt.Call("guarded", `{}`)))
	h.WaitPending(schemas.ApprovalID(turn, 1))
	ran := schemas.CallID(turn, 0)
	if b := h.Batch(turn); b.State != schemas.BatchAwaiting || b.Results[0] == nil || b.Results[0].Status != schemas.ResultOK {
		t.Fatalf("waiting batch %s, result of the call that ran %+v; want awaiting, holding the result", b.State, b.Results[0])
	}
	accepted := h.Messages(topology.StreamTurns, topology.OrderWildcard(schemas.SessionKey("cli", "waits")))
	if len(accepted) != 1 {
		t.Fatalf("%d accepted messages of the session, want 1", len(accepted))
	}
	jstest.Eventually(t, jstest.LongWait, "claim of the call that ran removed while its batch waits", func() bool {
		return errors.Is(claim(ran), store.ErrNotFound)
	})
	// The accepted message again, as a redelivery would bring it: the
	// executor goes on from the waiting batch and runs nothing.
	seq := h.PublishRaw(accepted[0].Subject, "again-"+turn, accepted[0].Data, nil)
	h.WaitConsumed("executor", seq)
	if auto.Runs(ran) != 1 {
		t.Fatalf("auto ran %d times after the accepted message came again, want 1", auto.Runs(ran))
	}

	h.Decide(schemas.ApprovalID(turn, 1), schemas.OptionApprove, "alice")
	b, _ := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || b.Results[0].Status != schemas.ResultOK || b.Results[1].Status != schemas.ResultOK {
		t.Fatalf("batch %s, results %+v %+v; want completed, both ok", b.State, b.Results[0], b.Results[1])
	}
	jstest.Eventually(t, jstest.LongWait, "claim of the approved call removed", func() bool {
		return errors.Is(claim(schemas.CallID(turn, 1)), store.ErrNotFound)
	})
	if auto.Runs(ran) != 1 || guarded.Runs(schemas.CallID(turn, 1)) != 1 {
		t.Fatalf("runs: auto %d, guarded %d; want 1 each", auto.Runs(ran), guarded.Runs(schemas.CallID(turn, 1)))
	}
}

// A run resumed a retention period or more after it began may find the
// claim of a call it interrupted gone (expired with its result): such a
// call is not run again, it needs attention. A call that still has its
// claim gets the claim's result, and a run that began less than a
// retention period ago, or that the caller began itself, runs a call that
// has no claim.
func TestAResumedRunAfterTheRetentionRunsNoClaimlessCall(t *testing.T) {
	const retention = 3 * time.Second
	tool := &pt.Counter{ToolName: "auto"}
	h := pt.Start(t, pt.Options{Policy: retentionPolicy, Tools: []tools.Tool{tool}, Retention: retention, Stages: []string{}})
	tc := h.Accept(h.Inbound("resumed", "alice", pt.Call("auto", `{}`), pt.Call("auto", `{}`), pt.Call("auto", `{}`), pt.Call("auto", `{}`)))
	b := &schemas.BatchRecord{TurnID: tc.TurnID, Context: tc.Context, Calls: tc.Calls, State: schemas.BatchStarted}
	ctx, cancel := h.Ctx()
	defer cancel()

	// Call 0 ran in the interrupted run and its claim holds the result.
	first, err := h.Engine.Execute(ctx, tc.Context, tc.Calls[0], "")
	if err != nil || first.Status != schemas.ResultOK {
		t.Fatalf("first run of call 0: %+v, %v", first, err)
	}

	b.UpdatedAt = h.Engine.Now().Add(-retention - time.Second)
	for _, tt := range []struct {
		name   string
		call   int
		status schemas.ResultStatus
		code   schemas.Code
		runs   int
	}{
		{"a call whose claim holds its result gets that result", 0, schemas.ResultOK, "", 1},
		{"a call with no claim is not run", 1, schemas.ResultNeedsAttention, schemas.CodeExecutionUncertain, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := tc.Calls[tt.call]
			res, err := h.Engine.ExecuteIn(ctx, b, true, c, "")
			if err != nil || res.Status != tt.status || res.Code != tt.code {
				t.Fatalf("result %+v, %v; want %s %s", res, err, tt.status, tt.code)
			}
			if got := tool.Runs(c.CallID); got != tt.runs {
				t.Fatalf("tool ran %d times, want %d", got, tt.runs)
			}
		})
	}
	for _, tt := range []struct {
		name    string
		call    int
		began   time.Time
		resumed bool
	}{
		{"a resumed run that began within the retention runs a call with no claim", 2, h.Engine.Now(), true},
		{"a run this attempt began runs a call with no claim, however old its state", 3, h.Engine.Now().Add(-retention - time.Second), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b.UpdatedAt = tt.began
			c := tc.Calls[tt.call]
			res, err := h.Engine.ExecuteIn(ctx, b, tt.resumed, c, "")
			if err != nil || res.Status != schemas.ResultOK || tool.Runs(c.CallID) != 1 {
				t.Fatalf("result %+v, %v, runs %d; want ok, run once", res, err, tool.Runs(c.CallID))
			}
		})
	}
}

// An approval's retention starts when it is decided. A batch that waits a
// whole retention period after one approval's decision for a sibling's
// finds the decided one gone when the last decision arrives: the barrier
// cannot be evaluated on all of its approvals, so the batch fails closed
// (APPROVAL_NOT_FOUND) and neither call runs.
func TestABatchWhoseDecidedApprovalLeftFailsClosed(t *testing.T) {
	const retention = 3 * time.Second
	guarded := &pt.Counter{ToolName: "guarded"}
	h := pt.Start(t, pt.Options{Policy: retentionPolicy, Tools: []tools.Tool{guarded}, Retention: retention})
	turn := h.Send(h.Inbound("straddles", "alice", pt.Call("guarded", `{"n":0}`), pt.Call("guarded", `{"n":1}`)))
	first, second := schemas.ApprovalID(turn, 0), schemas.ApprovalID(turn, 1)
	h.WaitPending(second)
	h.Decide(first, schemas.OptionApprove, "alice")
	jstest.Eventually(t, jstest.LongWait, "the decided approval removed while its sibling is pending", func() bool {
		return h.Approval(first) == nil
	})
	if a := h.Approval(second); a == nil || a.Status != schemas.ApprovalPending {
		t.Fatalf("the pending sibling: %+v; want it kept, pending", a)
	}
	h.Decide(second, schemas.OptionApprove, "alice")
	b, _ := h.WaitTerminal(turn)
	if b.State != schemas.BatchFailed || b.Code != schemas.CodeApprovalNotFound {
		t.Fatalf("batch %s, %s (%s); want failed with %s", b.State, b.Code, b.Reason, schemas.CodeApprovalNotFound)
	}
	for i := range 2 {
		if n := guarded.Runs(schemas.CallID(turn, i)); n != 0 {
			t.Fatalf("call %d ran %d times, want 0", i, n)
		}
	}
}
