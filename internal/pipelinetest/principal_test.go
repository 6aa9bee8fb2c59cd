package pipelinetest_test

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// TestPrincipalWithInvisibleCharactersIsRefused: a sender or a decider
// whose id holds a character a person cannot see (every row of
// reveal.HostileExamples), published on the bus as a transport would, is
// refused with INVALID_INPUT: the message is dead-lettered and becomes no
// turn, the decision is dead-lettered and decides nothing.
func TestPrincipalWithInvisibleCharactersIsRefused(t *testing.T) {
	guarded := &pt.Counter{ToolName: "guarded"}
	h := pt.Start(t, pt.Options{Policy: policyWith("required"), Tools: []tools.Tool{guarded}})
	for i, ex := range reveal.HostileExamples {
		t.Run(ex.Name, func(t *testing.T) {
			h := h.For(t)
			m := h.Inbound("principal", ex.Text, pt.Call("echo", `{"text":"hi"}`))
			m.V = schemas.InboundVersion
			data, err := msgpack.Marshal(m) // schemas.Encode would refuse it
			if err != nil {
				t.Fatal(err)
			}
			subject := topology.InboundSubject(m.Transport, m.SessionID)
			h.PublishRaw(subject, "", data, nil)
			dls := h.WaitDLQ(pt.Ingest, i+1)
			if got := dls[len(dls)-1].Header.Get(runner.HeaderCode); got != string(schemas.CodeInvalidInput) {
				t.Fatalf("dead letter code %s (%s), want INVALID_INPUT", got, dls[len(dls)-1].Header.Get(runner.HeaderReason))
			}
			if h.Batch(schemas.TurnID(m.Transport, m.MessageID)) != nil {
				t.Fatal("the message became a turn")
			}

			// A decision by such a decider on a pending approval.
			turn := h.Send(h.Inbound("principal-decide", "alice", pt.Call("guarded", `{}`)))
			id := h.WaitBatch(turn, "an approval", func(b *schemas.BatchRecord) bool { return b.Approvals[0] != "" }).Approvals[0]
			h.WaitPending(id)
			d := h.Decision(id, schemas.OptionApprove, "cli", ex.Text)
			d.V = schemas.DecisionVersion
			data, err = msgpack.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			h.PublishRaw(topology.DecisionSubject(d.Transport, d.ApprovalID), topology.DecisionMsgID(d.DecisionID), data, nil)
			// It has no trustworthy decider to address a rejection to: the
			// approver dead-letters it.
			dls = h.WaitDLQ(pt.Approver, i+1)
			if got := dls[len(dls)-1].Header.Get(runner.HeaderCode); got != string(schemas.CodeInvalidInput) {
				t.Fatalf("decision dead letter code %s (%s), want INVALID_INPUT", got, dls[len(dls)-1].Header.Get(runner.HeaderReason))
			}
			// The requester's own deny is what decides it.
			h.Decide(id, schemas.OptionDeny, "alice")
			if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultDenied || guarded.Total() != 0 {
				t.Fatalf("result %+v, %d runs; want denied, none", b.Results[0], guarded.Total())
			}
		})
	}
}
