package topology

import (
	"strconv"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Message ids (Nats-Msg-Id), one builder per kind of message, next to the
// subjects the messages go on. Each id is a pure function of what names the
// message, so that a repeated publish (a redelivery, a crash and a retry,
// two workers racing) carries the same id and the stream stores it once.
// They are part of the dedupe contract, and of docs/protocol.md §5: changing
// one would let a message published before an upgrade and again after it be
// stored twice.

// InboundMsgID is the id `tollgate send` (and the test drivers) give an
// inbound message: "<transport>:<message id>". A transport may choose its
// own, stable per message.
func InboundMsgID(transport, messageID string) string { return transport + ":" + messageID }

// AcceptedMsgID is the id of turnID's AcceptedTurn on SubjectTurnAccepted:
// the turn id itself.
func AcceptedMsgID(turnID string) string { return turnID }

// ScheduleMsgID is the id of the message schedule of follow-up turn turnID
// on SubjectTurnSchedule: "schedule:<turn>".
func ScheduleMsgID(turnID string) string { return "schedule:" + turnID }

// ReadyMsgID is the id of turnID's ready notice on SubjectTurnReady:
// "ready:<turn>".
func ReadyMsgID(turnID string) string { return "ready:" + turnID }

// ReadyAfterMsgID is the id of the ready notice that the end of turn
// after, the turn before turnID in its session's order, sends turnID:
// "ready:<turn>:after:<after>". It is not deduplicated against an
// announcement of turnID made before after ended (a repeated or early
// one, which found its turn not come), only against repeats of itself.
func ReadyAfterMsgID(turnID, after string) string { return "ready:" + turnID + ":after:" + after }

// DecisionMsgID is the id a transport gives a Decision on
// SubjectDecisionSubmit: its decision id.
func DecisionMsgID(decisionID string) string { return decisionID }

// RequestedMsgID is the id of the approval-requested event of approvalID:
// "requested:<approval>".
func RequestedMsgID(approvalID string) string { return "requested:" + approvalID }

// DecidedMsgID is the id of the decided event of approvalID (decided by a
// person, expired or abandoned) that an earlier version published:
// "decided:<approval>". This version's decision is the approval record's
// revision; it publishes a decided event only as an answer (RepeatMsgID).
func DecidedMsgID(approvalID string) string { return "decided:" + approvalID }

// RepeatMsgID is the id of the decided event that answers decision
// decisionID on approvalID, which changed no record (an idempotent
// success): "decided:<approval>:<decision>", one per decision.
func RepeatMsgID(approvalID, decisionID string) string {
	return "decided:" + approvalID + ":" + decisionID
}

// VotedMsgID is the id of the voted event of decision decisionID on
// approvalID: "voted:<approval>:<decision id>".
func VotedMsgID(approvalID, decisionID string) string {
	return "voted:" + approvalID + ":" + decisionID
}

// RejectedMsgID is the id of the rejection of decision decisionID:
// "rejected:<decision id>".
func RejectedMsgID(decisionID string) string { return "rejected:" + decisionID }

// AwaitingMsgID is the id of turnID's batch-awaiting notice:
// "awaiting:<turn>".
func AwaitingMsgID(turnID string) string { return "awaiting:" + turnID }

// RedriveMsgID is the id of turnID's redrive outcome of kind started or
// failed: "redrive:<kind>:<turn>". A deferred outcome is published without
// one (every attempt is stored); callers do not ask for it.
func RedriveMsgID(kind schemas.RedriveKind, turnID string) string {
	return "redrive:" + string(kind) + ":" + turnID
}

// OutcomeMsgID is the id of turnID's TurnOutcome: "outcome:<turn>".
func OutcomeMsgID(turnID string) string { return "outcome:" + turnID }

// DeadLetterMsgID is the id of stage's dead letter of the message at
// sequence seq of stream: "dlq:<stage>:<stream>:<seq>".
func DeadLetterMsgID(stage, stream string, seq uint64) string {
	return "dlq:" + stage + ":" + stream + ":" + strconv.FormatUint(seq, 10)
}

// ReplayNoticePrefix starts the id of every notice a replay rebuild
// publishes, so that a later replay can tell them from the stages' own.
const ReplayNoticePrefix = "replay:"

// ReplayNoticeMsgID is the id of the notice that rebuild run publishes for
// turnID: "replay:<run>:<turn>".
func ReplayNoticeMsgID(run, turnID string) string { return ReplayNoticePrefix + run + ":" + turnID }
