package approver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// BenchmarkApproverApply is the approver's hot path: load a pending record,
// check the decider, compare-and-set the decision and publish the decided
// event, against a real embedded server.
func BenchmarkApproverApply(b *testing.B) {
	h := pt.Start(b, pt.Options{Policy: testPolicy, Stages: []string{}})
	ctx := context.Background()
	ids := make([]string, b.N)
	for i := range ids {
		turn := schemas.TurnID("cli", fmt.Sprintf("bench-%d", i))
		args, digest, _ := schemas.CanonicalArgs(`{"path":"x","content":"y"}`)
		rec := &schemas.ApprovalRecord{
			ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: "bench", CallID: schemas.CallID(turn, 0),
			Context: &schemas.TurnContext{
				V: schemas.TurnContextVersion, SessionID: "bench", TurnID: turn,
				Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
				Transport: "cli", Channel: schemas.Channel{ID: "dm", Kind: schemas.ChannelDM},
				Audience: schemas.AudiencePersonal, TrustBoundary: "local", Interactive: true,
			},
			Tool: "write_file", Args: args, ArgsDigest: digest, PolicyVersion: "bench",
			Options: []string{schemas.OptionApprove, schemas.OptionDeny}, Status: schemas.ApprovalPending, RequestedAt: time.Now(),
		}
		if err := h.Keys.Seal(rec.Context); err != nil {
			b.Fatal(err)
		}
		if _, err := h.Store.Approvals.Create(ctx, rec.ApprovalID, rec); err != nil {
			b.Fatal(err)
		}
		ids[i] = rec.ApprovalID
	}
	decisions := make([]*schemas.Decision, b.N)
	for i, id := range ids {
		decisions[i] = h.Decision(id, schemas.OptionApprove, "cli", "alice")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := h.Approver.Apply(ctx, decisions[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got := h.Approval(ids[b.N-1]).Status; got != schemas.ApprovalApproved {
		b.Fatalf("last approval is %s, want approved: the benchmark measured a rejection path", got)
	}
}
