package topology

import (
	"errors"
	"slices"
	"strings"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Route is one kind of message on Tollgate's subjects: the subject prefix
// it travels on, the record its body carries and what the subject's last
// token names. This file is the one table of which record travels on which
// subject (docs/protocol.md, "Subjects"); every reader that handles more
// than one subject finds the route with RouteOf, or decodes with Read,
// rather than matching prefixes itself.
//
// The zero Route, RouteNone, is no route: a subject outside the table
// (a dead letter, a tools request, anything foreign).
type Route uint8

// The routes. The comment names the record each carries.
const (
	RouteNone              Route = iota
	RouteInbound                 // InboundMessage, tollgate.inbound.<transport>.<session key>
	RouteTurnAccepted            // AcceptedTurn, tollgate.turn.accepted.<session key>
	RouteTurnReady               // TurnNotice{ready}, tollgate.turn.ready.<session key>
	RouteTurnSchedule            // AcceptedTurn, tollgate.turn.schedule.<turn>
	RouteTurnPlan                // AcceptedTurn, tollgate.turn.plan.<session key>
	RouteTurnStep                // AcceptedTurn, tollgate.turn.step.<step batch turn id>
	RoutePlanReady               // TurnNotice, tollgate.turn.planready.<session key>
	RouteDecisionSubmit          // Decision, tollgate.decision.submit.<transport>.<approval>
	RouteApprovalRequested       // ApprovalRecord, tollgate.event.approval.requested.<turn>
	RouteApprovalDecided         // DecidedEvent, tollgate.event.approval.decided.<turn>
	RouteApprovalVoted           // VotedEvent, tollgate.event.approval.voted.<turn>
	RouteDecisionRejected        // DecisionRejected, tollgate.event.decision.rejected.<approval>
	RouteBatchAwaiting           // TurnNotice{awaiting}, tollgate.event.batch.awaiting.<turn>
	RouteRedrive                 // RedriveOutcome, tollgate.event.redrive.<kind>.<turn>
	RouteTurnOutcome             // TurnOutcome, tollgate.event.turn.outcome.<turn>
	RouteTurnReply               // ReplyEvent, tollgate.event.turn.reply.<turn>
	RouteGrantEvent              // GrantEvent, tollgate.event.grant.<kind>.<grant>
	RouteApprovalRevision        // ApprovalRecord, $KV.tollgate_approvals.<approval>: a write of the record (a decided one is the decision)
	RouteTurnOrder               // AcceptedTurn, tollgate.turn.order.exec.<session key>: an entry of the session's order the executor runs
	RouteTurnOrderPlan           // AcceptedTurn, tollgate.turn.order.plan.<session key>: an entry the planner runs
	numRoutes
)

// KeyKind is what the last token of a route's subject names.
type KeyKind uint8

// The key kinds.
const (
	KeyNone     KeyKind = iota
	KeySession          // a session key (schemas.SessionKey)
	KeyTurn             // a turn id
	KeyApproval         // an approval id
	KeyGrant            // a grant id
)

type route struct {
	prefix string
	name   string
	key    KeyKind
	decode func([]byte) (any, error)
}

// decoder returns schemas.Decode[T] with an untyped nil on error, so that
// a failed decode never yields a non-nil interface holding a nil pointer.
func decoder[T any, P schemas.Ptr[T]]() func([]byte) (any, error) {
	return func(b []byte) (any, error) {
		v, err := schemas.Decode[T, P](b)
		if err != nil {
			return nil, err
		}
		return v, nil
	}
}

var routes = [numRoutes]route{
	RouteNone:              {name: "none"},
	RouteInbound:           {SubjectInboundPrefix, "inbound", KeySession, decoder[schemas.InboundMessage]()},
	RouteTurnAccepted:      {SubjectTurnAccepted, "turn.accepted", KeySession, decoder[schemas.AcceptedTurn]()},
	RouteTurnReady:         {SubjectTurnReady, "turn.ready", KeySession, decoder[schemas.TurnNotice]()},
	RouteTurnSchedule:      {SubjectTurnSchedule, "turn.schedule", KeyTurn, decoder[schemas.AcceptedTurn]()},
	RouteTurnPlan:          {SubjectTurnPlan, "turn.plan", KeySession, decoder[schemas.AcceptedTurn]()},
	RouteTurnStep:          {SubjectTurnStep, "turn.step", KeyTurn, decoder[schemas.AcceptedTurn]()},
	RoutePlanReady:         {SubjectPlanReady, "turn.planready", KeySession, decoder[schemas.TurnNotice]()},
	RouteDecisionSubmit:    {SubjectDecisionSubmit, "decision.submit", KeyApproval, decoder[schemas.Decision]()},
	RouteApprovalRequested: {SubjectApprovalRequested, "approval.requested", KeyTurn, decoder[schemas.ApprovalRecord]()},
	RouteApprovalDecided:   {SubjectApprovalDecided, "approval.decided", KeyTurn, decoder[schemas.DecidedEvent]()},
	RouteApprovalVoted:     {SubjectApprovalVoted, "approval.voted", KeyTurn, decoder[schemas.VotedEvent]()},
	RouteDecisionRejected:  {SubjectDecisionRejected, "decision.rejected", KeyApproval, decoder[schemas.DecisionRejected]()},
	RouteBatchAwaiting:     {SubjectBatchAwaiting, "batch.awaiting", KeyTurn, decoder[schemas.TurnNotice]()},
	RouteRedrive:           {SubjectRedrive, "redrive", KeyTurn, decoder[schemas.RedriveOutcome]()},
	RouteTurnOutcome:       {SubjectTurnOutcome, "turn.outcome", KeyTurn, decoder[schemas.TurnOutcome]()},
	RouteTurnReply:         {SubjectTurnReply, "turn.reply", KeyTurn, decoder[schemas.ReplyEvent]()},
	RouteGrantEvent:        {SubjectGrantEvent, "grant", KeyGrant, decoder[schemas.GrantEvent]()},
	RouteApprovalRevision:  {ApprovalRevisionPrefix, "approval.revision", KeyApproval, decoder[schemas.ApprovalRecord]()},
	RouteTurnOrder:         {SubjectTurnOrder + OrderExec + ".", "turn.order.exec", KeySession, decoder[schemas.AcceptedTurn]()},
	RouteTurnOrderPlan:     {SubjectTurnOrder + OrderPlan + ".", "turn.order.plan", KeySession, decoder[schemas.AcceptedTurn]()},
}

// RouteOf is the route of subject, or RouteNone. No prefix in the table is
// a prefix of another, so at most one matches.
func RouteOf(subject string) Route {
	for r := RouteNone + 1; r < numRoutes; r++ {
		if strings.HasPrefix(subject, routes[r].prefix) {
			return r
		}
	}
	return RouteNone
}

// String is the route's short name ("approval.requested"), for logs and
// error reasons.
func (r Route) String() string {
	if r >= numRoutes {
		return "none"
	}
	return routes[r].name
}

// Prefix is the subject prefix of the route ("" for RouteNone).
func (r Route) Prefix() string {
	if r >= numRoutes {
		return ""
	}
	return routes[r].prefix
}

// Key is what the last token of the route's subjects names.
func (r Route) Key() KeyKind {
	if r >= numRoutes {
		return KeyNone
	}
	return routes[r].key
}

// Decode decodes data as the route's record, with schemas.Decode: the
// result is a pointer to the record type named in the route's comment
// (*schemas.ApprovalRecord for RouteApprovalRequested), or nil and the
// decode error (a *schemas.Error: MALFORMED, PAYLOAD_TOO_LARGE, ...). The
// route RouteNone decodes nothing: UNKNOWN_MESSAGE.
func (r Route) Decode(data []byte) (any, error) {
	if r == RouteNone || r >= numRoutes {
		return nil, schemas.Errorf(schemas.CodeUnknownMessage, "no record is routed here")
	}
	return routes[r].decode(data)
}

// ErrUnrouted is wrapped by Read's error for a subject outside the routes
// it was asked to read: errors.Is tells it from a body that did not decode.
var ErrUnrouted = errors.New("subject not routed here")

// Read finds the route of subject and decodes data as its record. When
// want names routes, a subject on any other route is refused with
// UNKNOWN_MESSAGE wrapping ErrUnrouted before anything is decoded, so a
// reader lists what it reads and type-switches on the record: among the
// routes it lists, no two should carry the same record type. With no want,
// every route in the table is read. The route is returned in every case
// (RouteNone for a subject outside the table), the record only when err is
// nil.
func Read(subject string, data []byte, want ...Route) (Route, any, error) {
	r := RouteOf(subject)
	if r == RouteNone || (len(want) > 0 && !slices.Contains(want, r)) {
		return r, nil, schemas.Errorf(schemas.CodeUnknownMessage, "%w: %s (reads %v)", ErrUnrouted, subject, want)
	}
	rec, err := r.Decode(data)
	return r, rec, err
}
