package approver_test

import (
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// retentionPolicy: "guarded" needs the requester's approval.
const retentionPolicy = `{
  "version": "retention-test",
  "tools": {"guarded": {"approval": "required"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// A decided approval outlives late decisions: for the retention period
// after its decision a conflicting late decision gets
// APPROVAL_ALREADY_DECIDED; once it has run out the record is gone and a late decision gets APPROVAL_NOT_FOUND, whose reason
// says the approval is unknown or past retention. Neither runs anything
// again, nor brings the record back.
func TestLateDecisionsAfterTheRetention(t *testing.T) {
	const retention = 4 * time.Second
	guarded := &pt.Counter{ToolName: "guarded"}
	h := pt.Start(t, pt.Options{Policy: retentionPolicy, Tools: []tools.Tool{guarded}, Retention: retention})
	turn := h.Send(h.Inbound("late", "alice", pt.Call("guarded", `{}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	h.Decide(id, schemas.OptionApprove, "alice")
	b, _ := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || guarded.Runs(schemas.CallID(turn, 0)) != 1 {
		t.Fatalf("turn ended %s with %d runs, want completed with 1", b.State, guarded.Runs(schemas.CallID(turn, 0)))
	}

	// Within the retention: the record still answers.
	late := h.Decision(id, schemas.OptionDeny, "cli", "alice")
	h.Submit(late)
	if rej := h.WaitRejection(late); rej.Code != schemas.CodeApprovalAlreadyDecided {
		t.Fatalf("late deny within the retention: %s (%s), want %s", rej.Code, rej.Reason, schemas.CodeApprovalAlreadyDecided)
	}

	// The approval's retention started when it was decided, the batch's
	// when it ended, a moment later: a redelivered decided event finds the
	// batch terminal or gone, and runs nothing either way.
	jstest.Eventually(t, jstest.LongWait, "approval record removed after the retention", func() bool { return h.Approval(id) == nil })

	for _, option := range []string{schemas.OptionApprove, schemas.OptionDeny} {
		d := h.Decision(id, option, "cli", "alice")
		h.Submit(d)
		rej := h.WaitRejection(d)
		if rej.Code != schemas.CodeApprovalNotFound || !strings.Contains(rej.Reason, approver.NotFoundMeaning) {
			t.Fatalf("%s after the retention: %s (%s), want %s saying it is unknown or past retention", option, rej.Code, rej.Reason, schemas.CodeApprovalNotFound)
		}
	}
	if a := h.Approval(id); a != nil {
		t.Fatalf("a late decision brought the approval back: %+v", a)
	}
	if n := guarded.Runs(schemas.CallID(turn, 0)); n != 1 {
		t.Fatalf("the call ran %d times, want 1", n)
	}
}
