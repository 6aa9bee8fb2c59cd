package batch_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	pt "github.com/tollgate-dev/tollgate/pipeline/pipelinetest"
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

// A claim outlives every message that could run its call again. The claim
// of a call that ran while its batch waits for an approval stays however
// long the wait (a redrive of the batch reads it), and only once the batch
// has ended does its retention start; by the time it has run out, the
// streams, which keep messages no longer than the retention
// (tollgate.Config.Validate), no longer hold the turn's accepted message,
// the only message that could create the batch, and so run the call,
// again.
func TestClaimsOutliveEveryMessageThatCouldRunTheirCall(t *testing.T) {
	const retention = 3 * time.Second
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
	if err := claim(ran); err != nil {
		t.Fatalf("claim of the call that ran: %v", err)
	}
	// A turn that ends after that claim was written: once its claim has
	// left KV, a retention started when the waiting call's claim was
	// written would have run out too.
	other := h.Send(h.Inbound("ends", "alice", pt.Call("auto", `{}`)))
	h.WaitTerminal(other)
	jstest.Eventually(t, 30*time.Second, "claim of the ended turn removed", func() bool {
		return errors.Is(claim(schemas.CallID(other, 0)), store.ErrNotFound)
	})
	if err := claim(ran); err != nil {
		t.Fatalf("claim of a call whose batch still waits: %v; want it kept until the batch ends", err)
	}

	h.Decide(schemas.ApprovalID(turn, 1), schemas.OptionApprove, "alice")
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
		t.Fatalf("batch %s, want completed", b.State)
	}
	for _, id := range []string{ran, schemas.CallID(turn, 1)} {
		jstest.Eventually(t, 30*time.Second, "claim of "+id+" removed after its batch ended", func() bool {
			return errors.Is(claim(id), store.ErrNotFound)
		})
	}
	if got := h.Messages(topology.StreamTurns, topology.AcceptedSubject(schemas.SessionKey("waits"))); len(got) != 0 {
		t.Fatalf("the turns stream still holds %d accepted messages of the session after its claims left KV", len(got))
	}
	if auto.Runs(ran) != 1 || guarded.Runs(schemas.CallID(turn, 1)) != 1 {
		t.Fatalf("runs: auto %d, guarded %d; want 1 each", auto.Runs(ran), guarded.Runs(schemas.CallID(turn, 1)))
	}
}
