package redriver_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// asLegacy rewrites a current approval record in the version 1 shape an
// older executor wrote: no TurnContext, copies of some authority fields.
// drop names copied fields to leave out; edit changes the copy.
func asLegacy(h *pt.H, a *schemas.ApprovalRecord, drop []string, edit func(*schemas.ApprovalRecordV1)) []byte {
	h.T.Helper()
	tc := a.Context
	sender := schemas.Sender{ID: tc.Requester.SenderID, Kind: tc.Requester.Kind, Verified: tc.Requester.Verified}
	ch := tc.Channel
	old := &schemas.ApprovalRecordV1{
		V: 1, ApprovalID: a.ApprovalID, TurnID: a.TurnID, SessionID: a.SessionID, CallID: a.CallID,
		Tool: a.Tool, Args: a.Args, ArgsDigest: a.ArgsDigest, PolicyVersion: a.PolicyVersion, Options: a.Options,
		Status: a.Status, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt,
		Transport: tc.Transport, Sender: &sender, Channel: &ch, Audience: tc.Audience, TrustBoundary: tc.TrustBoundary,
	}
	if edit != nil {
		edit(old)
	}
	b, err := msgpack.Marshal(old)
	if err != nil {
		h.T.Fatal(err)
	}
	var m map[string]any
	if err := msgpack.Unmarshal(b, &m); err != nil {
		h.T.Fatal(err)
	}
	for _, k := range drop {
		delete(m, k)
	}
	if b, err = msgpack.Marshal(m); err != nil {
		h.T.Fatal(err)
	}
	return b
}

func TestLegacyApprovalRecords(t *testing.T) {
	h := pt.Start(t, pt.Options{Policy: countPolicy})
	restored := func() float64 {
		return h.Metric("tollgate_legacy_restored_total", map[string]string{"result": "restored"})
	}
	incomplete := func() float64 {
		return h.Metric("tollgate_legacy_restored_total", map[string]string{"result": "incomplete"})
	}

	t.Run("a complete version 1 record is restored once, decided and run under the batch's authority", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("legacy-ok", "alice", write("legacy-ok.txt")))
		id := schemas.ApprovalID(turn, 0)
		before := restored()
		h.PutRaw(h.Store.Approvals.KV, id, asLegacy(h, h.WaitPending(id), nil, nil))

		d := h.Decide(id, schemas.OptionApprove, "alice")
		b, out := h.WaitTerminal(turn)
		if r := b.Results[0]; b.State != schemas.BatchCompleted || r.Status != schemas.ResultOK {
			t.Fatalf("batch %s, result %+v; want the legacy-approved call run", b.State, r)
		}
		if out.State != schemas.TurnCompleted {
			t.Fatalf("outcome %s", out.State)
		}
		if rej := h.Rejections(id); len(rej) != 0 {
			t.Fatalf("decision %s rejected: %+v", d.DecisionID, rej[0])
		}
		// Written back by the decision: now version 2, with the restored
		// context marked and sealed.
		a := h.Approval(id)
		if a.V != schemas.ApprovalVersion || a.Context == nil || !a.Context.LegacyRestored || a.Status != schemas.ApprovalApproved {
			t.Fatalf("record after the decision: v%d status %s context %+v", a.V, a.Status, a.Context)
		}
		if err := h.Keys.Verify(a.Context); err != nil {
			t.Fatalf("restored context is not sealed: %v", err)
		}
		if got := restored() - before; got < 1 {
			t.Fatalf("restored counter rose by %v, want at least 1", got)
		}
		if files := h.SandboxFiles(); !contains(files, "legacy-ok.txt") {
			t.Fatalf("sandbox %v", files)
		}
	})

	tests := []struct {
		name string
		drop []string
		edit func(*schemas.ApprovalRecordV1)
	}{
		{name: "no sender", drop: []string{"sender"}},
		{name: "no transport", drop: []string{"transport"}},
		{name: "no channel", drop: []string{"channel"}},
		{name: "no audience", drop: []string{"audience"}},
		{name: "no trust boundary", drop: []string{"trust_boundary"}},
		{name: "no session", drop: []string{"session_id"}},
		{name: "an audience wider than its channel", edit: func(o *schemas.ApprovalRecordV1) { o.Audience = schemas.AudiencePublic }},
		{name: "a requester other than the batch's", edit: func(o *schemas.ApprovalRecordV1) { o.Sender.ID = "mallory" }},
	}
	for i, tc := range tests {
		t.Run("a version 1 record with "+tc.name+" never runs", func(t *testing.T) {
			h := h.For(t)
			turn := h.Send(h.Inbound(fmt.Sprintf("legacy-bad%d", i), "alice", write(fmt.Sprintf("legacy-bad%d.txt", i))))
			id := schemas.ApprovalID(turn, 0)
			before := incomplete()
			h.PutRaw(h.Store.Approvals.KV, id, asLegacy(h, h.WaitPending(id), tc.drop, tc.edit))

			forged := tc.name == "a requester other than the batch's"
			decider, want := "alice", schemas.CodeLegacyContextIncomplete
			if forged {
				// Restorable, so the decision of the requester the forged
				// copy names applies to it; the redriver then refuses the
				// restored authority against the batch's own context.
				decider, want = "mallory", schemas.CodeTurnContextMismatch
			}
			d := h.Decide(id, schemas.OptionApprove, decider)
			if !forged {
				if rej := h.WaitRejection(d); rej.Code != want {
					t.Fatalf("decision rejected with %s, want %s", rej.Code, want)
				}
				if incomplete()-before < 1 {
					t.Fatal("incomplete counter did not rise")
				}
				// Nothing was decided, so nothing triggers a redrive; a
				// recovery pass (a re-announced batch) must fail closed.
				reannounce(h, turn)
			}
			b, out := h.WaitTerminal(turn)
			if b.State != schemas.BatchFailed || b.Code != want || out.Code != want {
				t.Fatalf("batch %s %s outcome %s, want failed %s", b.State, b.Code, out.Code, want)
			}
			if files := h.SandboxFiles(); contains(files, fmt.Sprintf("legacy-bad%d.txt", i)) {
				t.Fatalf("the call ran on an unrestorable legacy record: %v", files)
			}
		})
	}
}

// reannounce publishes the batch-awaiting notice of turn again, as a
// recovery pass would, so the redriver evaluates its barrier.
func reannounce(h *pt.H, turn string) {
	h.T.Helper()
	h.PublishRaw(topology.EventSubject(topology.SubjectBatchAwaiting, turn), h.NextID("recover"),
		mustEncode(h, &schemas.TurnNotice{TurnID: turn, SessionID: "x", Kind: schemas.NoticeAwaiting, At: time.Now()}), nil)
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}
