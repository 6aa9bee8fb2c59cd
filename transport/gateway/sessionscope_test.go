package gateway

import (
	"net/http"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// scopePolicy: Slack and the gateway are interactive transports in
// different trust boundaries; write_file waits for a person; a newer turn
// of a session supersedes its waiting batch.
const scopePolicy = `{
  "version": "gateway-session-scope",
  "tools": {"echo": {"approval": "never"}, "write_file": {"approval": "required"}},
  "transports": {
    "slack":   {"trust_boundary": "workspace", "interactive": true},
    "gateway": {"trust_boundary": "api", "interactive": true}
  },
  "sessions": {"busy": "supersede"}
}`

// An API key that sends a Slack thread's session id over POST /v1/turns
// gets a session of the gateway transport (security rule 12): its turn is
// not queued behind the Slack user's waiting call, does not supersede the
// Slack user's pending approval, and the Slack session's order holds
// only the Slack user's turn.
func TestAnAPIKeyCannotJoinASlackThreadsSession(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Policy: scopePolicy}, nil)
	const thread = "slack:T024BE7LD:C0123ABC:1710408400.000050"
	m := g.Inbound(thread, "U-alice", pipelinetest.Call("write_file", `{"path":"alice.txt","content":"mine"}`))
	m.Transport = "slack"
	victim := g.Send(m)
	approval := schemas.ApprovalID(victim, 0)
	g.WaitPending(approval)

	resp, body := g.do("POST", "/v1/turns", "a", submitBody(thread, "mallory", call("echo", `{"text":"hi"}`)))
	sub := want[SubmitResponse](t, resp, body, http.StatusAccepted)
	if o := g.WaitOutcome(sub.TurnID); o.State != schemas.TurnCompleted {
		t.Fatalf("the key's turn ended %s (%s), want completed on its own", o.State, o.Code)
	}
	if a := g.Approval(approval); a.Status != schemas.ApprovalPending {
		t.Fatalf("the Slack user's approval is %s (%+v), want pending", a.Status, a.Decision)
	}
	if got := g.OrderAt(schemas.SessionKey("slack", thread)); len(got) != 1 || got[0] != victim {
		t.Fatalf("the Slack session's order %v, want only %s", got, victim)
	}
	if b := g.Batch(sub.TurnID); b.Context.Transport != "gateway" || b.Context.SessionKey != schemas.SessionKey("gateway", thread) {
		t.Fatalf("the key's turn is in session %q of %s, want the gateway's own", b.Context.SessionKey, b.Context.Transport)
	}
}
