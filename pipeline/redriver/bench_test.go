package redriver_test

import (
	"context"
	"fmt"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// BenchmarkRedriveBarrierMet is the redriver's hot path once every approval
// of a batch is decided: load the batch and its approvals, check authority,
// compare-and-set to started, run the approved call under a claim, end the
// batch and publish its outcome, against a real embedded server. Setting up
// each batch (through the executor and approver) is not timed.
func BenchmarkRedriveBarrierMet(b *testing.B) {
	count := &pt.Counter{}
	h := pt.Start(b, pt.Options{Policy: countPolicy, Tools: []tools.Tool{count}, Stages: []string{}})
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		b.StopTimer()
		i++
		at := h.Accept(h.Inbound(fmt.Sprintf("bench-%d", i), "alice", pt.Call("count", `{}`)))
		if err := h.Executor.Accept(ctx, at); err != nil {
			b.Fatal(err)
		}
		if err := h.Approver.Apply(ctx, h.Decision(schemas.ApprovalID(at.TurnID, 0), schemas.OptionApprove, "cli", "alice")); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := h.Redriver.Redrive(ctx, at.TurnID, "bench"); err != nil {
			b.Fatal(err)
		}
	}
}
