package topology_test

import (
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The message ids are part of the dedupe contract: a message published by
// one version and again by the next (a redelivery across an upgrade) must
// carry the same id, or the stream stores it twice. These are the ids as
// docs/protocol.md §5 states them; a change here is a protocol change.
func TestMessageIDsAreStable(t *testing.T) {
	const turn, approval, decision = "t-7d207e1f030d85151eb8", "a-t-7d207e1f030d85151eb8-1", "d-42"
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"an inbound message sent by the CLI", topology.InboundMsgID("cli", "m-1"), "cli:m-1"},
		{"an accepted turn", topology.AcceptedMsgID(turn), turn},
		{"a follow-up's message schedule", topology.ScheduleMsgID(turn + "-f0"), "schedule:" + turn + "-f0"},
		{"a ready notice", topology.ReadyMsgID(turn), "ready:" + turn},
		{"a decision", topology.DecisionMsgID(decision), decision},
		{"an approval-requested event", topology.RequestedMsgID(approval), "requested:" + approval},
		{"a decided event", topology.DecidedMsgID(approval), "decided:" + approval},
		{"a decision rejection", topology.RejectedMsgID(decision), "rejected:" + decision},
		{"a batch-awaiting notice", topology.AwaitingMsgID(turn), "awaiting:" + turn},
		{"a started redrive outcome", topology.RedriveMsgID(schemas.RedriveStarted, turn), "redrive:started:" + turn},
		{"a failed redrive outcome", topology.RedriveMsgID(schemas.RedriveFailed, turn), "redrive:failed:" + turn},
		{"a turn outcome", topology.OutcomeMsgID(turn), "outcome:" + turn},
		{"a dead letter", topology.DeadLetterMsgID("executor", topology.StreamTurns, 18446744073709551615), "dlq:executor:TOLLGATE_TURNS:18446744073709551615"},
		{"a replay rebuild's notice", topology.ReplayNoticeMsgID("r1", turn), "replay:r1:" + turn},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Fatalf("message id %q, want %q", tc.got, tc.want)
			}
		})
	}
}
