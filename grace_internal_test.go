package tollgate

import (
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
)

// The approver waits before it takes a missing approval for unknown only
// where a read can be behind: with more than one replica.
func TestTheApproverGivesAMissingApprovalAGraceOnlyOnACluster(t *testing.T) {
	for _, tt := range []struct {
		replicas int
		want     bool
	}{{1, false}, {3, true}} {
		c := topology.DefaultConfig()
		c.Replicas = tt.replicas
		if got := notFoundGrace(c); (got == approver.DefaultNotFoundGrace) != tt.want || (got == 0) == tt.want {
			t.Errorf("replicas %d: NotFoundGrace %v, want a grace: %v", tt.replicas, got, tt.want)
		}
	}
}
