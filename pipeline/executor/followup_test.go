package executor_test

import (
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/pipeline/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

const followUpPolicy = `{
  "version": "followup-test",
  "tools": {
    "schedule_followup": {"approval": "never"},
    "echo":              {"approval": "never"},
    "write_file":        {"approval": "required", "audiences": {"public": "deny"}}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

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
	h := pt.Start(t, pt.Options{Policy: followUpPolicy})

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
		// Schedules are due at whole seconds, so 2s may fire after 1s.
		if gap := b.CreatedAt.Sub(h.Batch(turn).CreatedAt); gap < time.Second {
			t.Fatalf("follow-up accepted %v after the turn: not delayed", gap)
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
