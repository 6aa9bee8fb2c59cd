package topology_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Each stage's consumer has its own durable name and is accepted by the
// server on its stream (a filter outside the stream's subjects is refused),
// and it sees what its stage consumes and nothing else.
func TestEachStageConsumerFitsItsStream(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		spec     topology.ConsumerSpec
		sees     []string
		overlook []string
	}{
		{topology.IngestConsumer(), []string{topology.InboundSubject("cli", "s-1")}, nil},
		{topology.ExecutorConsumer(),
			[]string{topology.AcceptedSubject("s-1"), topology.ReadySubject("s-1")},
			[]string{topology.SubjectTurnSchedule + "t-1"}},
		{topology.ApproverConsumer(), []string{topology.DecisionSubject("cli", "a-1")}, nil},
		{topology.RedriverConsumer(), []string{topology.ApprovalRevisionSubject("a-1"), topology.ApprovalRevisionSubject("a-2")}, nil},
		{topology.RedriverNoticesConsumer(),
			[]string{topology.EventSubject(topology.SubjectBatchAwaiting, "t-1")},
			[]string{topology.EventSubject(topology.SubjectApprovalDecided, "t-1"), topology.EventSubject(topology.SubjectTurnOutcome, "t-1"), topology.EventSubject(topology.SubjectApprovalRequested, "t-1")}},
	} {
		name := tc.spec.Config.Durable
		t.Run(tc.spec.Stream+"/"+name, func(t *testing.T) {
			for _, subj := range append(append([]string{}, tc.sees...), tc.overlook...) {
				if _, err := env.JS.Publish(ctx, subj, []byte("x")); err != nil {
					t.Fatalf("publish %s: %v", subj, err)
				}
			}
			cons, err := env.JS.CreateConsumer(ctx, tc.spec.Stream, tc.spec.Config)
			if err != nil {
				t.Fatalf("create %s on %s: %v", name, tc.spec.Stream, err)
			}
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumPending != uint64(len(tc.sees)) {
				t.Fatalf("%s has %d messages pending, want the %d it consumes", name, info.NumPending, len(tc.sees))
			}
		})
	}
	seen := map[string]bool{}
	for _, c := range topology.Consumers() {
		if seen[c.Config.Durable] {
			t.Errorf("two stages share the durable %s", c.Config.Durable)
		}
		seen[c.Config.Durable] = true
	}
	if len(seen) != 4 {
		t.Errorf("%d stage consumers, want 4", len(seen))
	}
}
