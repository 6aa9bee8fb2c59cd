package executor_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const followUpPolicy = `{
  "version": "followup-test",
  "tools": {
    "schedule_followup": {"approval": "never"},
    "echo":              {"approval": "never"},
    "stamp":             {"approval": "never"},
    "write_file":        {"approval": "required", "audiences": {"public": "deny"}}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// stamp is a tool that records when each of its calls started.
type stamp struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (*stamp) Name() string { return "stamp" }

func (s *stamp) Run(_ context.Context, c tools.Call) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at[c.CallID] = time.Now()
	return "stamped", nil
}

func (s *stamp) startedAt(t *testing.T, callID string) time.Time {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.at[callID]
	if !ok {
		t.Fatalf("call %s did not run", callID)
	}
	return at
}

// acceptedTurn returns the follow-up turnID as the server published it on
// session's accepted subject when its schedule was due.
func acceptedTurn(t *testing.T, h *pt.H, session, turnID string) *schemas.AcceptedTurn {
	t.Helper()
	for _, at := range pt.DecodeAll[schemas.AcceptedTurn](t, h.Messages(topology.StreamTurns, topology.AcceptedSubject(schemas.SessionKey("cli", session)))) {
		if at.TurnID == turnID {
			return at
		}
	}
	t.Fatalf("no accepted turn %s", turnID)
	return nil
}

// followUpOf waits for the follow-up scheduled by call 0 of turn and checks
// that it carries turn's TurnContext unchanged and is addressed like it.
func followUpOf(t *testing.T, h *pt.H, turn string) (*schemas.BatchRecord, *schemas.TurnOutcome) {
	t.Helper()
	parent, pout := h.WaitTerminal(turn)
	if r := parent.Results[0]; r.Status != schemas.ResultOK {
		t.Fatalf("schedule_followup: %+v", r)
	}
	fid := schemas.FollowUpTurnID(schemas.CallID(turn, 0))
	b, out := h.WaitTerminal(fid)
	if schemas.ContextDigest(b.Context) != schemas.ContextDigest(parent.Context) {
		t.Fatalf("follow-up context %+v differs from the submitting turn's %+v", b.Context, parent.Context)
	}
	if err := h.Keys.Verify(b.Context); err != nil {
		t.Fatalf("follow-up context does not verify: %v", err)
	}
	if b.Origin != schemas.CallID(turn, 0) {
		t.Fatalf("origin %q", b.Origin)
	}
	if out.Reply != pout.Reply || out.Audience != pout.Audience {
		t.Fatalf("follow-up addressed to %+v/%s, the turn to %+v/%s", out.Reply, out.Audience, pout.Reply, pout.Audience)
	}
	return b, out
}

func TestFollowUpWorkInheritsTheTurnContext(t *testing.T) {
	clock := &stamp{at: map[string]time.Time{}}
	h := pt.Start(t, pt.Options{Policy: followUpPolicy, Tools: []tools.Tool{clock}})

	t.Run("a delayed follow-up runs later under the same context and reply target", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("fu-1", "alice", pt.Call("schedule_followup", `{"tool":"echo","args":{"text":"later"},"delay":"2s"}`)))
		b, out := followUpOf(t, h, turn)
		if b.State != schemas.BatchCompleted || out.Results[0].Output != "later" {
			t.Fatalf("follow-up %s %+v", b.State, out.Results)
		}
		if out.Audience != schemas.AudiencePersonal || out.Reply.Channel.Kind != schemas.ChannelDM {
			t.Fatalf("a personal turn's follow-up is addressed to %+v (%s)", out.Reply, out.Audience)
		}
		if gap := b.CreatedAt.Sub(h.Batch(turn).CreatedAt); gap < 2*time.Second {
			t.Fatalf("follow-up accepted %v after the turn, before its 2s delay", gap)
		}
		if b.FollowUpDepth != 1 {
			t.Fatalf("follow-up depth %d, want 1", b.FollowUpDepth)
		}
	})

	t.Run("a follow-up never starts before its not_before", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("fu-5", "alice", pt.Call("schedule_followup", `{"tool":"stamp","delay":"1500ms"}`)))
		b, _ := followUpOf(t, h, turn)
		at := acceptedTurn(t, h, "fu-5", b.TurnID)
		if started := clock.startedAt(t, schemas.CallID(b.TurnID, 0)); started.Before(at.NotBefore) {
			t.Fatalf("the follow-up started at %v, before its not_before %v", started, at.NotBefore)
		}
	})

	t.Run("a follow-up that arrives before its not_before waits for it", func(t *testing.T) {
		h := h.For(t)
		// Its message schedule fired early by the executor's clock: the
		// accepted turn is published at once, due 1.5s later.
		at := h.Accept(h.Inbound("fu-6", "alice", pt.Call("stamp", `{}`)))
		origin := schemas.CallID(at.TurnID, 0)
		at.TurnID, at.Origin, at.FollowUpDepth = schemas.FollowUpTurnID(origin), origin, 1
		at.Calls[0].CallID = schemas.CallID(at.TurnID, 0)
		at.NotBefore = time.Now().Add(1500 * time.Millisecond)
		h.Publish(topology.AcceptedSubject(schemas.SessionKey("cli", "fu-6")), topology.AcceptedMsgID(at.TurnID), at)
		if b, _ := h.WaitTerminal(at.TurnID); b.Results[0].Status != schemas.ResultOK {
			t.Fatalf("follow-up %+v", b.Results[0])
		}
		if started := clock.startedAt(t, at.Calls[0].CallID); started.Before(at.NotBefore) {
			t.Fatalf("the follow-up started at %v, %v before its not_before", started, at.NotBefore.Sub(started))
		}
	})

	t.Run("a follow-up of an invalid tool name is refused and nothing is scheduled", func(t *testing.T) {
		for _, c := range []struct{ name, tool string }{{"with a space", "Bad Tool"}, {"with a path", "echo/../x"}} {
			t.Run(c.name, func(t *testing.T) {
				h := h.For(t)
				turn := h.Send(h.Inbound("fu-7", "alice", pt.Call("schedule_followup", `{"tool":"`+c.tool+`"}`)))
				b, _ := h.WaitTerminal(turn)
				if r := b.Results[0]; r.Status != schemas.ResultError || !strings.Contains(r.Reason, string(schemas.CodeFollowUpRejected)) {
					t.Fatalf("%+v, want it refused with FOLLOWUP_REJECTED", r)
				}
				fid := schemas.FollowUpTurnID(schemas.CallID(turn, 0))
				if m := h.Messages(topology.StreamTurns, topology.SubjectTurnSchedule+fid); len(m) != 0 {
					t.Fatalf("%d schedules stored for a refused follow-up", len(m))
				}
			})
		}
	})

	t.Run("a follow-up call that needs approval asks the original requester, who decides it", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("fu-2", "alice", pt.Call("schedule_followup", `{"tool":"write_file","args":{"path":"fu.txt","content":"x"}}`)))
		fid := schemas.FollowUpTurnID(schemas.CallID(turn, 0))
		id := schemas.ApprovalID(fid, 0)
		a := h.WaitPending(id)
		if a.Context.Requester.Principal != "cli:alice" || a.Context.TurnID != turn {
			t.Fatalf("follow-up approval under %+v", a.Context)
		}
		// Nobody else may decide it: the authority is alice's turn's.
		if rej := h.WaitRejection(h.Decide(id, schemas.OptionApprove, "mallory")); rej.Code != schemas.CodeDeciderNotAuthorized {
			t.Fatalf("mallory's decision: %s", rej.Code)
		}
		h.Decide(id, schemas.OptionApprove, "alice")
		b, _ := followUpOf(t, h, turn)
		if b.Results[0].Status != schemas.ResultOK {
			t.Fatalf("approved follow-up: %+v", b.Results[0])
		}
		if _, ok := h.File("fu.txt"); !ok {
			t.Fatal("approved follow-up did not write")
		}
	})

	t.Run("a public turn's follow-up is still denied what the public audience is denied", func(t *testing.T) {
		h := h.For(t)
		m := h.Inbound("fu-3", "alice", pt.Call("schedule_followup", `{"tool":"write_file","args":{"path":"pub.txt","content":"x"}}`))
		m.Channel = schemas.Channel{ID: "general", Kind: schemas.ChannelPublic}
		turn := h.Send(m)
		b, out := followUpOf(t, h, turn)
		if r := b.Results[0]; r.Status != schemas.ResultDenied || r.Code != schemas.CodePolicyDenied {
			t.Fatalf("follow-up of a public turn: %+v, want denied by policy", r)
		}
		if out.Audience != schemas.AudiencePublic {
			t.Fatalf("audience %s", out.Audience)
		}
	})

	t.Run("follow-up chains stop at the depth limit", func(t *testing.T) {
		h := h.For(t)
		args := `{"tool":"echo","args":{"text":"bottom"}}`
		for i := 0; i < schemas.MaxFollowUpDepth+1; i++ {
			args = `{"tool":"schedule_followup","args":` + args + `}`
		}
		turn := h.Send(h.Inbound("fu-4", "alice", pt.Call("schedule_followup", args)))
		id := turn
		for d := 1; d <= schemas.MaxFollowUpDepth; d++ {
			id = schemas.FollowUpTurnID(schemas.CallID(id, 0))
			h.WaitTerminal(id)
		}
		b, _ := h.WaitTerminal(id)
		if r := b.Results[0]; r.Status != schemas.ResultError || !strings.Contains(r.Reason, string(schemas.CodeFollowUpRejected)) {
			t.Fatalf("the call past the depth limit: %+v, want it refused with FOLLOWUP_REJECTED", r)
		}
	})
}
