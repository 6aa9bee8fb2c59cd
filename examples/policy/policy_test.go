// Package policy_test checks the example policies in this folder against a
// real pipeline.
package policy_test

import (
	"os"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// web-walkthrough.json lets web:alice, signed in to the inbox, approve the
// README walkthrough's write_file that cli:alice asked for, and nobody
// else on the web transport.
func TestWebWalkthroughPolicyLetsTheInboxApproveTheWalkthrough(t *testing.T) {
	pol, err := os.ReadFile("web-walkthrough.json")
	if err != nil {
		t.Fatal(err)
	}
	h := pt.Start(t, pt.Options{Policy: string(pol)})
	turn := h.Send(h.Inbound("demo", "alice",
		pt.Call("echo", `{"text":"on it"}`),
		pt.Call("write_file", `{"path":"notes/alice.txt","content":"buy milk"}`)))
	id := schemas.ApprovalID(turn, 1)
	rec := h.WaitPending(id)

	inboxChannel := &schemas.Channel{ID: "inbox", Kind: schemas.ChannelDM}
	person := func(id string) schemas.Sender {
		return schemas.Sender{ID: id, Kind: schemas.SenderUser, Verified: true}
	}
	if err := h.Policy.MayDecideApproval(rec, "web", person("mallory"), inboxChannel, h.Keys); schemas.CodeOf(err) != schemas.CodeDeciderNotAuthorized {
		t.Fatalf("web:mallory may decide: %v, want DECIDER_NOT_AUTHORIZED", err)
	}
	if err := h.Policy.MayDecideApproval(rec, "web", person("alice"), inboxChannel, h.Keys); err != nil {
		t.Fatalf("web:alice may not decide the walkthrough's write_file: %v", err)
	}

	d := h.Decision(id, schemas.OptionApprove, "web", "alice")
	d.Channel, d.ArgsDigest = inboxChannel, rec.ArgsDigest
	h.Submit(d)
	_, out := h.WaitTerminal(turn)
	if out.State != schemas.TurnCompleted || len(out.Results) != 2 || out.Results[1].Status != schemas.ResultOK {
		t.Fatalf("outcome %+v, want completed with write_file ok", out)
	}
	if got, _ := h.File("notes/alice.txt"); got != "buy milk" {
		t.Fatalf("notes/alice.txt = %q, want the approved content", got)
	}
	if a := h.Approval(id); a.Decision == nil || a.Decision.Principal != "web:alice" {
		t.Fatalf("decision %+v, want web:alice's", a.Decision)
	}
}
