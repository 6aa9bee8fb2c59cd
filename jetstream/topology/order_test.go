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

func TestOrderMessageIDsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name, id, turn string
		arrival        uint64
		ok             bool
	}{
		{"an entry", topology.OrderMsgID("t-1"), "t-1", 0, true},
		{"a repeat", topology.OrderRepeatMsgID("t-1", 42), "t-1", 42, true},
		{"a repeat without its arrival", "order:t-1:", "", 0, false},
		{"a repeat at zero", "order:t-1:0", "", 0, false},
		{"a repeat with a padded number", "order:t-1:042", "", 0, false},
		{"an accepted turn's id", topology.AcceptedMsgID("t-1"), "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			turn, arrival, ok := topology.ParseOrderMsgID(tc.id)
			if turn != tc.turn || arrival != tc.arrival || ok != tc.ok {
				t.Fatalf("ParseOrderMsgID(%q) = %q %d %v, want %q %d %v", tc.id, turn, arrival, ok, tc.turn, tc.arrival, tc.ok)
			}
		})
	}
}
