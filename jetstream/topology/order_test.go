package topology_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

func TestOrderSubjectsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name, subject, kind, key string
		ok                       bool
	}{
		{"an executor entry", topology.OrderSubject(topology.OrderExec, "cli-abc"), topology.OrderExec, "cli-abc", true},
		{"a planner entry", topology.OrderSubject(topology.OrderPlan, "cli-abc"), topology.OrderPlan, "cli-abc", true},
		{"an unknown kind", "tollgate.turn.order.run.cli-abc", "", "", false},
		{"no session key", "tollgate.turn.order.exec.", "", "", false},
		{"a key of two tokens", "tollgate.turn.order.exec.a.b", "", "", false},
		{"the session's wildcard", topology.OrderWildcard("cli-abc"), "", "", false},
		{"an accepted subject", topology.AcceptedSubject("cli-abc"), "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind, key, ok := topology.ParseOrderSubject(tc.subject)
			if kind != tc.kind || key != tc.key || ok != tc.ok {
				t.Fatalf("ParseOrderSubject(%q) = %q %q %v, want %q %q %v", tc.subject, kind, key, ok, tc.kind, tc.key, tc.ok)
			}
		})
	}
}
