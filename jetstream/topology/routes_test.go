package topology_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "schemas", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Each route decodes the record docs/protocol.md names for its subject,
// from that record's golden encoding, and reads a subject built the way
// the publishers build it.
func TestRoutesDecodeTheirRecord(t *testing.T) {
	reply, err := schemas.Encode(&schemas.ReplyEvent{TurnID: "t-1", SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		subject string
		route   topology.Route
		data    []byte
		want    string
		key     topology.KeyKind
	}{
		{topology.InboundSubject("cli", "s"), topology.RouteInbound, golden(t, "inbound_message.v1.msgpack"), "*schemas.InboundMessage", topology.KeySession},
		{topology.SubjectTurnAccepted + "k", topology.RouteTurnAccepted, golden(t, "accepted_turn.v1.msgpack"), "*schemas.AcceptedTurn", topology.KeySession},
		{topology.SubjectTurnReady + "k", topology.RouteTurnReady, golden(t, "turn_notice.v1.msgpack"), "*schemas.TurnNotice", topology.KeySession},
		{topology.SubjectTurnSchedule + "t-1", topology.RouteTurnSchedule, golden(t, "accepted_turn.v1.msgpack"), "*schemas.AcceptedTurn", topology.KeyTurn},
		{topology.PlanSubject("k"), topology.RouteTurnPlan, golden(t, "accepted_turn.v1.msgpack"), "*schemas.AcceptedTurn", topology.KeySession},
		{topology.StepSubject("t-1-p1"), topology.RouteTurnStep, golden(t, "accepted_turn.v1.msgpack"), "*schemas.AcceptedTurn", topology.KeyTurn},
		{topology.PlanReadySubject("k"), topology.RoutePlanReady, golden(t, "turn_notice.v1.msgpack"), "*schemas.TurnNotice", topology.KeySession},
		{topology.SubjectDecisionSubmit + "cli.a-1", topology.RouteDecisionSubmit, golden(t, "decision.v1.msgpack"), "*schemas.Decision", topology.KeyApproval},
		{topology.SubjectApprovalRequested + "t-1", topology.RouteApprovalRequested, golden(t, "approval_record.v2.msgpack"), "*schemas.ApprovalRecord", topology.KeyTurn},
		{topology.SubjectApprovalDecided + "t-1", topology.RouteApprovalDecided, golden(t, "decided_event.v1.msgpack"), "*schemas.DecidedEvent", topology.KeyTurn},
		{topology.SubjectApprovalVoted + "t-1", topology.RouteApprovalVoted, golden(t, "voted_event.v1.msgpack"), "*schemas.VotedEvent", topology.KeyTurn},
		{topology.SubjectDecisionRejected + "a-1", topology.RouteDecisionRejected, golden(t, "decision_rejected.v1.msgpack"), "*schemas.DecisionRejected", topology.KeyApproval},
		{topology.SubjectBatchAwaiting + "t-1", topology.RouteBatchAwaiting, golden(t, "turn_notice.v1.msgpack"), "*schemas.TurnNotice", topology.KeyTurn},
		{topology.SubjectRedrive + "started.t-1", topology.RouteRedrive, golden(t, "redrive_outcome.v1.msgpack"), "*schemas.RedriveOutcome", topology.KeyTurn},
		{topology.SubjectTurnOutcome + "t-1", topology.RouteTurnOutcome, golden(t, "turn_outcome.v1.msgpack"), "*schemas.TurnOutcome", topology.KeyTurn},
		{topology.SubjectTurnReply + "t-1", topology.RouteTurnReply, reply, "*schemas.ReplyEvent", topology.KeyTurn},
		{topology.SubjectGrantEvent + "created.g-1", topology.RouteGrantEvent, golden(t, "grant_event.v1.msgpack"), "*schemas.GrantEvent", topology.KeyGrant},
		{topology.ApprovalRevisionSubject("a-1"), topology.RouteApprovalRevision, golden(t, "approval_record.v2.msgpack"), "*schemas.ApprovalRecord", topology.KeyApproval},
		{topology.OrderSubject(topology.OrderExec, "k"), topology.RouteTurnOrder, golden(t, "accepted_turn.v1.msgpack"), "*schemas.AcceptedTurn", topology.KeySession},
		{topology.OrderSubject(topology.OrderPlan, "k"), topology.RouteTurnOrderPlan, golden(t, "accepted_turn.v1.msgpack"), "*schemas.AcceptedTurn", topology.KeySession},
	}
	seen := map[topology.Route]bool{}
	for _, tt := range tests {
		t.Run(tt.route.String(), func(t *testing.T) {
			seen[tt.route] = true
			if got := topology.RouteOf(tt.subject); got != tt.route {
				t.Fatalf("RouteOf(%s) = %v, want %v", tt.subject, got, tt.route)
			}
			if !strings.HasPrefix(tt.subject, tt.route.Prefix()) {
				t.Errorf("%v: prefix %q does not start %s", tt.route, tt.route.Prefix(), tt.subject)
			}
			if tt.route.Key() != tt.key {
				t.Errorf("%v: key %v, want %v", tt.route, tt.route.Key(), tt.key)
			}
			r, rec, err := topology.Read(tt.subject, tt.data, tt.route)
			if err != nil || r != tt.route {
				t.Fatalf("Read(%s) = %v, %v", tt.subject, r, err)
			}
			if got := fmt.Sprintf("%T", rec); got != tt.want {
				t.Errorf("Read(%s) decoded %s, want %s", tt.subject, got, tt.want)
			}
		})
	}
	for r := topology.RouteNone + 1; r.String() != "none"; r++ {
		if !seen[r] {
			t.Errorf("route %d (%v) is not covered by this table", r, r)
		}
	}
}

// A subject outside the table, or outside the routes a reader names, is
// refused with UNKNOWN_MESSAGE before its body is looked at; a body that
// does not decode is the decode error, with no record (not a typed nil).
func TestReadRefusesWhatItWasNotAskedFor(t *testing.T) {
	notice := golden(t, "turn_notice.v1.msgpack")
	for _, c := range []struct {
		subject string
		want    []topology.Route
	}{
		{topology.DLQSubject("executor"), nil},
		{topology.SubjectToolsList, nil},
		{"tollgate.turn.plannedready.k", nil},
		{topology.PlanReadySubject("k"), []topology.Route{topology.RouteTurnAccepted, topology.RouteTurnReady}},
	} {
		_, rec, err := topology.Read(c.subject, notice, c.want...)
		var se *schemas.Error
		if !errors.As(err, &se) || se.Code != schemas.CodeUnknownMessage || !errors.Is(err, topology.ErrUnrouted) || rec != nil {
			t.Errorf("Read(%s, %v) = %v, %v; want UNKNOWN_MESSAGE and no record", c.subject, c.want, rec, err)
		}
	}
	r, rec, err := topology.Read(topology.SubjectTurnOutcome+"t-1", notice)
	var se *schemas.Error
	if r != topology.RouteTurnOutcome || rec != nil || !errors.As(err, &se) || errors.Is(err, topology.ErrUnrouted) {
		t.Errorf("a TurnNotice body on turn.outcome: %v, %#v, %v; want the decode error and a nil record", r, rec, err)
	}
}

// No route's prefix is a prefix of another's, so RouteOf's first match is
// the only one.
func TestRoutePrefixesAreDisjoint(t *testing.T) {
	for a := topology.RouteNone + 1; a.String() != "none"; a++ {
		for b := topology.RouteNone + 1; b.String() != "none"; b++ {
			if a != b && strings.HasPrefix(b.Prefix(), a.Prefix()) {
				t.Errorf("%v's prefix %q is a prefix of %v's %q", a, a.Prefix(), b, b.Prefix())
			}
		}
	}
}
