package pipelinetest_test

import (
	"fmt"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// routed is what a turn outcome says about where it goes and what it
// tells: every row compares the whole of it.
type routed struct {
	State    schemas.TurnState
	Code     schemas.Code
	Reply    schemas.ReplyTarget
	Audience schemas.Audience
	Results  int // how many results it carries
}

// nowhere: an outcome whose context does not verify, or is not its turn's,
// goes nowhere and tells nothing but the failure code.
func nowhere(code schemas.Code) routed {
	return routed{State: schemas.TurnFailed, Code: code}
}

// TestAdversarialOutcomeRouting edits where a turn's outcome would go, the
// way an attacker with write access to the batches bucket (or to the
// accepted-turn subject) could, and checks that the outcome is addressed
// only by a context whose seal verifies and that belongs to the turn. In
// the tampered rows, alice's turn has already run a call in her DM when its
// batch is edited: without the rule, its failed outcome would carry that
// call's result to the channel the edited context names.
func TestAdversarialOutcomeRouting(t *testing.T) {
	guarded := &pt.Counter{ToolName: "guarded"}
	shared := pt.Start(t, pt.Options{Policy: policyWith("required"), Tools: []tools.Tool{guarded}})
	general := schemas.Channel{ID: "general", Kind: schemas.ChannelPublic}

	tests := []struct {
		name   string
		attack func(t *testing.T, h *pt.H, session string) (turn string)
		want   func(session string) routed
	}{
		{
			name: "no attack: alice's turn in her DM is answered in her DM",
			attack: func(t *testing.T, h *pt.H, s string) string {
				return h.Send(h.Inbound(s, "alice", pt.Call("echo", `{"text":"hi"}`)))
			},
			want: func(string) routed {
				return routed{State: schemas.TurnCompleted, Results: 1, Audience: schemas.AudiencePersonal,
					Reply: schemas.ReplyTarget{Transport: "cli", Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}}}
			},
		},
		{
			name: "re-pointed reply: the batch's reply channel is edited to a public channel after a call ran in the DM",
			attack: func(t *testing.T, h *pt.H, s string) string {
				return ranThenTampered(t, h, s, func(b *schemas.BatchRecord) { b.Context.Channel = general })
			},
			want: func(string) routed { return nowhere(schemas.CodeTurnContextTampered) },
		},
		{
			name: "re-pointed reply: the batch's channel and audience are both widened to public",
			attack: func(t *testing.T, h *pt.H, s string) string {
				return ranThenTampered(t, h, s, func(b *schemas.BatchRecord) {
					b.Context.Channel, b.Context.Audience = general, schemas.AudiencePublic
				})
			},
			want: func(string) routed { return nowhere(schemas.CodeTurnContextTampered) },
		},
		{
			name: "renamed key: the seal's key id of the batch's context is edited",
			attack: func(t *testing.T, h *pt.H, s string) string {
				return ranThenTampered(t, h, s, func(b *schemas.BatchRecord) { b.Context.Seal.KeyID = "renamed" })
			},
			want: func(string) routed { return nowhere(schemas.CodeSealKeyUnknown) },
		},
		{
			name: "swapped context: another turn's sealed context, from a public channel, replaces the batch's",
			attack: func(t *testing.T, h *pt.H, s string) string {
				other := h.Inbound(s+"-public", "bob", pt.Call("echo", `{"text":"hi all"}`))
				other.Channel = general
				b, _ := h.WaitTerminal(h.Send(other))
				return ranThenTampered(t, h, s, func(mine *schemas.BatchRecord) { mine.Context = b.Context })
			},
			want: func(string) routed { return nowhere(schemas.CodeTurnContextMismatch) },
		},
		{
			name: "forged accepted turn: an invented, unsealed context names a public channel",
			attack: func(t *testing.T, h *pt.H, s string) string {
				turn := schemas.TurnID("cli", h.NextID("forged"))
				args, digest, _ := schemas.CanonicalArgs(`{"text":"hi"}`)
				at := &schemas.AcceptedTurn{
					TurnID: turn, AcceptedAt: time.Now().UTC(),
					Context: &schemas.TurnContext{
						V: schemas.TurnContextVersion, SessionID: s, TurnID: turn,
						Requester: schemas.Requester{Principal: "cli:mallory", SenderID: "mallory", Kind: schemas.SenderUser, Verified: true},
						Transport: "cli", Channel: general, Audience: schemas.AudiencePublic, TrustBoundary: "local",
					},
					Calls: []schemas.ToolCall{{CallID: schemas.CallID(turn, 0), Index: 0, Tool: "echo", Args: args, ArgsDigest: digest}},
				}
				h.Publish(topology.AcceptedSubject(schemas.SessionKey("cli", s)), topology.AcceptedMsgID(turn), at)
				return turn
			},
			want: func(string) routed { return nowhere(schemas.CodeTurnContextTampered) },
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := shared.For(t)
			session := fmt.Sprintf("route%d", i)
			turn := tc.attack(t, h, session)
			// The outcome is the later fact: the turn is over when it is
			// stored, and there is exactly one.
			b, out := h.WaitTerminal(turn)
			got := routed{State: out.State, Code: out.Code, Reply: out.Reply, Audience: out.Audience, Results: len(out.Results)}
			if want := tc.want(session); got != want {
				t.Fatalf("outcome of a batch %s %s:\n  %+v\nwant\n  %+v", b.State, b.Code, got, want)
			}
			if n := len(h.Outcomes(turn)); n != 1 {
				t.Fatalf("%d outcomes, want 1", n)
			}
			if n := guarded.Runs(schemas.CallID(turn, 1)); n != 0 {
				t.Fatalf("the guarded call ran %d times", n)
			}
		})
	}
}

// ranThenTampered sends alice's turn in her DM with a call that runs at once
// (echo) and one that waits for her approval (guarded), waits until the
// first has run and the redriver has answered the awaiting notice, edits
// the batch record with tamper, and has alice approve the second: the
// redriver then fails the batch closed on its context.
func ranThenTampered(t *testing.T, h *pt.H, session string, tamper func(*schemas.BatchRecord)) string {
	t.Helper()
	turn := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"in my DM"}`), pt.Call("guarded", fmt.Sprintf(`{"session":%q}`, session))))
	id := schemas.ApprovalID(turn, 1)
	h.WaitPending(id)
	h.WaitState(turn, schemas.BatchAwaiting) // then nothing moves it until the decision
	if r := h.Batch(turn).Results[0]; r == nil || r.Status != schemas.ResultOK {
		t.Fatalf("echo's result %+v before the edit, want ok: the row needs a call that ran in the DM", r)
	}
	h.MutateBatch(turn, tamper)
	if rej := decide(h, h.Decision(id, schemas.OptionApprove, "cli", "alice")); rej != "" {
		t.Fatalf("alice's approval was rejected with %s", rej)
	}
	return turn
}
