package schemas_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

func TestDescendsFrom(t *testing.T) {
	root := "t-0123456789abcdef0123"
	cases := []struct {
		name, turn string
		want       bool
	}{
		{"a planner step", root + "-p0", true},
		{"a later planner step", root + "-p12", true},
		{"a follow-up", root + "-3-f", true},
		{"a follow-up of a step's call", root + "-p1-0-f", true},
		{"a step of a follow-up", root + "-0-f-p2", true},
		{"the turn itself", root, false},
		{"another turn", "t-ffffffffffffffffffff-p0", false},
		{"a step without an index", root + "-p", false},
		{"a step with a non-numeric index", root + "-px", false},
		{"a call id", root + "-0", false},
		{"a longer id sharing the prefix", root + "0-p0", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := schemas.DescendsFrom(tc.turn, root); got != tc.want {
				t.Fatalf("DescendsFrom(%q) = %v, want %v", tc.turn, got, tc.want)
			}
		})
	}
}

func TestPlannerStepOf(t *testing.T) {
	root := "t-0123456789abcdef0123"
	got, n, ok := schemas.PlannerStepOf(schemas.PlannerStepTurnID(root, 7))
	if !ok || got != root || n != 7 {
		t.Fatalf("PlannerStepOf = %q, %d, %v", got, n, ok)
	}
	for _, id := range []string{root, root + "-0-f", root + "-p", root + "-p01", root + "-p-1"} {
		if _, _, ok := schemas.PlannerStepOf(id); ok {
			t.Errorf("PlannerStepOf(%q) accepted a turn id that is not a step batch's", id)
		}
	}
}
