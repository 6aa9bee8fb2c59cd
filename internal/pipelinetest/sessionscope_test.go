package pipelinetest_test

import (
	"slices"
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// scopePolicy has two interactive transports in different trust
// boundaries, a gated tool, and the supersede busy policy: a newer turn of
// a session abandons the approvals its waiting batch holds.
const scopePolicy = `{
  "version": "session-scope",
  "tools": {
    "echo":    {"approval": "never"},
    "guarded": {"approval": "required"}
  },
  "transports": {
    "slack":   {"trust_boundary": "workspace", "interactive": true},
    "gateway": {"trust_boundary": "api", "interactive": true},
    "cli":     {"trust_boundary": "local", "interactive": true}
  },
  "sessions": {"busy": "supersede"}
}`

// inboundOn is pt.Inbound on another transport.
func inboundOn(h *pt.H, transport, session, sender string, calls ...schemas.ProposedCall) *schemas.InboundMessage {
	m := h.Inbound(session, sender, calls...)
	m.Transport = transport
	return m
}

// A session belongs to its transport (security rule 12): a principal of
// another transport that sends the victim's session id, through its own
// inbound subject as its NATS permissions allow, gets a session of its
// own. It is not queued behind the victim's waiting batch, and under the
// supersede policy it does not abandon the victim's pending approval.
func TestASessionBelongsToItsTransport(t *testing.T) {
	guarded := &pt.Counter{ToolName: "guarded"}
	h := pt.Start(t, pt.Options{Policy: scopePolicy, Tools: []tools.Tool{guarded}})
	const thread = "slack:T024BE7LD:C0123ABC:1710408400.000050"

	victim := h.Send(inboundOn(h, "slack", thread, "U-alice", pt.Call("guarded", `{"n":1}`)))
	approval := schemas.ApprovalID(victim, 0)
	h.WaitPending(approval)
	h.WaitState(victim, schemas.BatchAwaiting)

	for _, tt := range []struct {
		name      string
		transport string
		call      schemas.ProposedCall
	}{
		{"a gateway key's turn in the Slack thread's session id runs on its own", "gateway", pt.Call("echo", `{"text":"hi"}`)},
		{"a cli user's turn in the Slack thread's session id runs on its own", "cli", pt.Call("echo", `{"text":"hi"}`)},
		{"a gateway key's gated call does not supersede the Slack user's approval", "gateway", pt.Call("guarded", `{"n":2}`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := h.For(t)
			attacker := h.Send(inboundOn(h, tt.transport, thread, "mallory", tt.call))
			if tt.call.Tool == "echo" {
				// Queued behind the victim's waiting batch, it would wait for
				// a person who is not going to answer.
				if o := h.WaitOutcome(attacker); o.State != schemas.TurnCompleted {
					t.Fatalf("attacker's turn ended %s (%s), want completed on its own", o.State, o.Code)
				}
			} else {
				// The later fact: the attacker's own approval is pending, so
				// its batch acquired a session and applied the busy policy.
				h.WaitPending(schemas.ApprovalID(attacker, 0))
			}
			if a := h.Approval(approval); a.Status != schemas.ApprovalPending {
				t.Fatalf("victim's approval is %s (decision %+v), want still pending", a.Status, a.Decision)
			}
			if got := h.OrderAt(schemas.SessionKey("slack", thread)); !slices.Equal(got, []string{victim}) {
				t.Fatalf("victim's session's order %v, want only %s", got, victim)
			}
			if own := h.OrderAt(schemas.SessionKey(tt.transport, thread)); !slices.Contains(own, attacker) {
				t.Fatalf("attacker's session's order %v, want its own turn %s there", own, attacker)
			}
			if b := h.Batch(attacker); b.OrderAfter == victim {
				t.Fatalf("the attacker's turn was placed behind the victim's")
			}
		})
	}

	// The victim's turn still belongs to the victim: approved, it runs once.
	d := h.Decision(approval, schemas.OptionApprove, "slack", "U-alice")
	h.Submit(d)
	if o := h.WaitOutcome(victim); o.State != schemas.TurnCompleted || guarded.Runs(schemas.CallID(victim, 0)) != 1 {
		t.Fatalf("victim's turn ended %s, its call ran %d times; want completed, once", o.State, guarded.Runs(schemas.CallID(victim, 0)))
	}
}

// Turns accepted by the previous version carry contexts without a session
// key; their session is under the legacy key. Taken from the accepted
// subject after the upgrade, they join the legacy session's order (the
// executor appends them): a pending approval still resumes its batch, and
// the turn behind it runs once the first ends (docs/protocol.md §3.1).
// The turns are published as the previous version's ingest published them:
// sealed contexts without session_key, on the accepted subject of the
// legacy key.
func TestLegacySessionsFinishAcrossTheUpgrade(t *testing.T) {
	guarded := &pt.Counter{ToolName: "guarded"}
	queue := strings.Replace(scopePolicy, `"busy": "supersede"`, `"busy": "queue"`, 1)
	h := pt.Start(t, pt.Options{Policy: queue, Tools: []tools.Tool{guarded}})
	const session = "upgraded"
	legacy := func(calls ...schemas.ProposedCall) string {
		at := h.Accept(h.Inbound(session, "alice", calls...))
		at.Context.SessionKey, at.Context.Seal = "", nil
		if err := h.Keys.Seal(at.Context); err != nil {
			t.Fatal(err)
		}
		h.Publish(topology.AcceptedSubject(schemas.LegacySessionKey(session)), topology.AcceptedMsgID(at.TurnID), at)
		return at.TurnID
	}
	before := schemas.LegacySessionKeyUses()
	first := legacy(pt.Call("guarded", `{"n":1}`))
	h.WaitPending(schemas.ApprovalID(first, 0))
	second := legacy(pt.Call("echo", `{"text":"queued before the upgrade"}`))
	h.WaitBatch(second, "queued behind the first in the legacy session's order", func(b *schemas.BatchRecord) bool {
		return b.State == schemas.BatchQueued && b.OrderAfter == first
	})
	if got := h.OrderAt(schemas.LegacySessionKey(session)); !slices.Equal(got, []string{first, second}) {
		t.Fatalf("the legacy session's order %v, want [%s %s]", got, first, second)
	}
	if h.Session(session) != nil || len(h.Order(session)) != 0 {
		t.Fatalf("a legacy turn joined the scoped session")
	}

	h.Decide(schemas.ApprovalID(first, 0), schemas.OptionApprove, "alice")
	if o := h.WaitOutcome(first); o.State != schemas.TurnCompleted || guarded.Runs(schemas.CallID(first, 0)) != 1 {
		t.Fatalf("first legacy turn ended %s, ran %d times", o.State, guarded.Runs(schemas.CallID(first, 0)))
	}
	if o := h.WaitOutcome(second); o.State != schemas.TurnCompleted {
		t.Fatalf("queued legacy turn ended %s (%s)", o.State, o.Code)
	}
	if schemas.LegacySessionKeyUses() == before {
		t.Errorf("the legacy session path was not counted")
	}

	// A new turn of the same session id gets the scoped session.
	third := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"after"}`)))
	if o := h.WaitOutcome(third); o.State != schemas.TurnCompleted {
		t.Fatalf("new turn ended %s", o.State)
	}
	if b := h.Batch(third); b.Context.SessionKey != schemas.SessionKey("cli", session) {
		t.Fatalf("new turn's context has session key %q, want the scoped one", b.Context.SessionKey)
	}
}

// A message that another transport stores under a victim session's key (its
// NATS permissions let it publish anything under its own inbound token)
// never becomes a turn, so it holds none of the victim's turns back: ingest
// dead-letters it, and the session-order check looks only at the victim's
// own transport's subject (topology.InboundSessionSubject).
func TestAMessageForgedUnderAnotherTransportsKeyHoldsNothingBack(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: scopePolicy})
	const thread = "slack:T024BE7LD:C0123ABC:1710408500.000070"
	forged := inboundOn(h, "gateway", thread, "mallory", pt.Call("echo", `{"text":"first in line"}`))
	h.Publish(topology.SubjectInboundPrefix+"gateway."+schemas.SessionKey("slack", thread), topology.InboundMsgID("gateway", forged.MessageID), forged)
	if n := len(h.WaitDLQ(pt.Ingest, 1)); n != 1 {
		t.Fatalf("%d dead letters of ingest, want the forged message's", n)
	}

	victim := h.Send(inboundOn(h, "slack", thread, "U-alice", pt.Call("echo", `{"text":"mine"}`)))
	if o := h.WaitOutcome(victim); o.State != schemas.TurnCompleted {
		t.Fatalf("victim's turn ended %s (%s), want completed", o.State, o.Code)
	}
	if !h.SessionFreeAt(schemas.SessionKey("slack", thread)) {
		t.Fatalf("victim's session is not free after its one turn ended")
	}
}
