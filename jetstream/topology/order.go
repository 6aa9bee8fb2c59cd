package topology

import (
	"strconv"
	"strings"
)

// A session's order: the one sequence in which its turns run, kept on
// TOLLGATE_TURNS (package jetstream/turnorder is its one writer).
//
// Ingest appends each turn it accepts to its session's order, on
// OrderSubject(kind, session key): OrderExec for a turn the executor runs,
// OrderPlan for a planner turn. Every append is a compare-and-set against
// the session's last entry (Nats-Expected-Last-Subject-Sequence with
// Nats-Expected-Last-Subject-Sequence-Subject OrderWildcard(session key)),
// so two writers never both place a turn after the same entry, and each
// entry names the one before it (HeaderOrderAfter) and carries the
// session's arrival watermark (HeaderOrderArrival). The stored
// Nats-Expected-Last-Subject-Sequence header is the sequence of that
// entry. docs/protocol.md §5 describes the subjects and headers.
const (
	// SubjectTurnOrder prefixes a session's order: + kind + "." + session
	// key. Its subjects carry AcceptedTurn bodies, as the accepted and
	// plan subjects do.
	SubjectTurnOrder = "tollgate.turn.order."

	// OrderExec is the kind of an entry the executor runs.
	OrderExec = "exec"
	// OrderPlan is the kind of an entry the planner runs (a turn with text
	// and no calls, when the planner is on).
	OrderPlan = "plan"

	// HeaderOrderAfter names the turn of the entry before this one in its
	// session's order. It is absent on a session's first entry.
	HeaderOrderAfter = "Tollgate-Order-After"
	// HeaderOrderArrival is the session's arrival watermark after this
	// entry: the highest TOLLGATE_INBOUND sequence of any arrival-ordered
	// turn in the session's order up to it (a decimal number; absent or 0
	// while there is none).
	HeaderOrderArrival = "Tollgate-Order-Arrival"
)

// OrderSubject is where ingest appends a turn of kind (OrderExec or
// OrderPlan) to the order of the session with key sessionKey.
func OrderSubject(kind, sessionKey string) string {
	return SubjectTurnOrder + kind + "." + sessionKey
}

// OrderWildcard matches every entry of the order of the session with key
// sessionKey, of either kind: the subject of an append's compare-and-set
// and of the read of the session's last entry.
func OrderWildcard(sessionKey string) string { return SubjectTurnOrder + "*." + sessionKey }

// OrderFilter matches the entries of kind of every session: a stage's
// consumer filter.
func OrderFilter(kind string) string { return SubjectTurnOrder + kind + ".*" }

// ParseOrderSubject is OrderSubject's inverse: the kind and session key of
// subject; ok is false for any other subject.
func ParseOrderSubject(subject string) (kind, sessionKey string, ok bool) {
	rest, found := strings.CutPrefix(subject, SubjectTurnOrder)
	if !found {
		return "", "", false
	}
	kind, sessionKey, found = strings.Cut(rest, ".")
	if !found || (kind != OrderExec && kind != OrderPlan) || sessionKey == "" || strings.Contains(sessionKey, ".") {
		return "", "", false
	}
	return kind, sessionKey, true
}

// OrderMsgID is the id of turnID's entry in its session's order:
// "order:<turn>". It differs from the accepted subject's id
// (AcceptedMsgID) so that a turn an earlier version accepted can still be
// appended to its session's order in the duplicate window.
func OrderMsgID(turnID string) string { return "order:" + turnID }

// OrderRepeatMsgID is the id of a repeated entry of turnID: a later
// delivery of the inbound message it was accepted from, stored at
// TOLLGATE_INBOUND sequence arrival, that must raise its session's arrival
// watermark (a transport's retry under another message id):
// "order:<turn>:<arrival>", one per delivery.
func OrderRepeatMsgID(turnID string, arrival uint64) string {
	return OrderMsgID(turnID) + ":" + strconv.FormatUint(arrival, 10)
}

// ParseOrderMsgID is the inverse of OrderMsgID and OrderRepeatMsgID: the
// turn (not checked as a key) and, for a repeat, the arrival (0
// otherwise); ok is false for any other id.
func ParseOrderMsgID(id string) (turn string, arrival uint64, ok bool) {
	rest, found := strings.CutPrefix(id, OrderMsgID(""))
	if !found {
		return "", 0, false
	}
	turn, n, repeat := strings.Cut(rest, ":")
	if !repeat {
		return turn, 0, true
	}
	arrival, err := strconv.ParseUint(n, 10, 64)
	if err != nil || arrival == 0 || strconv.FormatUint(arrival, 10) != n {
		return "", 0, false
	}
	return turn, arrival, true
}
