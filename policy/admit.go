package policy

import (
	"errors"
	"fmt"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Admit is the admission rule, its one home: whether the inbound message
// data, stored on subject, becomes a turn under p, and which turn. The
// ingest stage applies it to every message; the executor's session-order
// check, the gateway's submit and `tollgate send` (before they publish)
// call it too, so that they all decide alike. It is pure and
// deterministic (no I/O and no clock: the turn's times come from prov and
// the message).
//
// The message must decode as a current InboundMessage within the input
// limits (schemas.Decode), must have been published on its own subject,
// tollgate.inbound.<transport>.<session key> (so a transport permitted to
// publish only on its own subjects cannot borrow another transport's trust
// rule or principals, and the executor finds a session's messages where it
// looks for them), and must pass Accept. On success it returns the turn
// Accept builds, its TurnContext not yet sealed. Every error is a
// *schemas.Error: MALFORMED_PAYLOAD, PAYLOAD_TOO_LARGE,
// SCHEMA_VERSION_UNSUPPORTED, INVALID_INPUT, ARGS_INVALID_JSON or
// TURN_CONTEXT_INVALID; a message refused here can never become a turn.
func (p *Policy) Admit(subject string, data []byte, prov schemas.Provenance) (*schemas.AcceptedTurn, error) {
	msg, err := schemas.Decode[schemas.InboundMessage](data)
	if err != nil {
		return nil, err
	}
	// The transport token is the publisher's identity (NATS permissions
	// give each transport its own subjects); the body may not claim
	// another. The session token must be the body's session key, or the
	// executor's arrival-order check would look in the wrong place.
	// A message of the previous version's subject (topology.LegacyInboundSubject)
	// is admitted too: its turn still gets the transport-scoped session.
	if want := topology.InboundSubject(msg.Transport, msg.SessionID); subject != want && subject != topology.LegacyInboundSubject(msg.Transport, msg.SessionID) {
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "message claims transport %q and session %q but arrived on %s (want %s)",
			msg.Transport, msg.SessionID, subject, want)
	}
	return p.Accept(msg, prov)
}

// Accept is the part of Admit that follows decoding: it builds the accepted
// turn of the decoded message msg under p, with its TurnContext not yet
// sealed (the ingest stage seals it with its key ring before publishing;
// see package seal). prov supplies the stream-derived provenance
// (sequence, receipt time, instance); its Transport and MessageID are
// filled from msg. It fails with a *schemas.Error (ARGS_INVALID_JSON,
// PAYLOAD_TOO_LARGE, INVALID_INPUT, TURN_CONTEXT_INVALID) for input that
// cannot become a turn.
func (p *Policy) Accept(msg *schemas.InboundMessage, prov schemas.Provenance) (*schemas.AcceptedTurn, error) {
	audience, err := schemas.AudienceOf(msg.Channel.Kind)
	if err != nil {
		return nil, err
	}
	turnID := schemas.TurnID(msg.Transport, msg.MessageID)
	rule := p.Transport(msg.Transport)
	prov.Transport, prov.MessageID = msg.Transport, msg.MessageID
	if prov.ReceivedAt.IsZero() {
		prov.ReceivedAt = msg.SentAt.UTC()
	}
	tc := &schemas.TurnContext{
		V:          schemas.TurnContextVersion,
		SessionID:  msg.SessionID,
		SessionKey: schemas.SessionKey(msg.Transport, msg.SessionID),
		TurnID:     turnID,
		Requester: schemas.Requester{
			Principal: schemas.Principal(msg.Transport, msg.Sender.ID),
			SenderID:  msg.Sender.ID, Display: msg.Sender.Display,
			Kind: msg.Sender.Kind, Verified: msg.Sender.Verified,
		},
		Transport:     msg.Transport,
		Channel:       msg.Channel,
		Audience:      audience,
		TrustBoundary: rule.TrustBoundary,
		Interactive:   rule.Prompts(msg.Sender),
		Provenance:    prov,
		CreatedAt:     prov.ReceivedAt,
	}
	if err := tc.Check(); err != nil {
		return nil, err
	}
	calls := make([]schemas.ToolCall, len(msg.Calls))
	for i, c := range msg.Calls {
		canon, digest, err := schemas.CanonicalArgs(c.Args)
		if err != nil {
			return nil, callError(i, c.Tool, err)
		}
		calls[i] = schemas.ToolCall{CallID: schemas.CallID(turnID, i), Index: i, Tool: c.Tool, Args: canon, ArgsDigest: digest}
	}
	return &schemas.AcceptedTurn{TurnID: turnID, Context: tc, Text: msg.Text, Calls: calls, AcceptedAt: prov.ReceivedAt}, nil
}

// Prompts reports whether sender can answer an approval prompt under r: a
// user whose identity the transport verified, on a transport whose rule
// allows prompts. It mirrors what the approver accepts from a decider, so
// a prompt is never emitted that the requester could not validly answer.
func (r TransportRule) Prompts(sender schemas.Sender) bool {
	return r.Interactive && sender.Kind == schemas.SenderUser && sender.Verified
}

// callError names call i in err, a coded error of schemas.CanonicalArgs,
// keeping its code once (not repeated inside the reason).
func callError(i int, tool string, err error) error {
	var e *schemas.Error
	if !errors.As(err, &e) {
		e = &schemas.Error{Code: schemas.CodeArgsInvalidJSON, Reason: err.Error()}
	}
	return &schemas.Error{Code: e.Code, Reason: fmt.Sprintf("call %d (%s): %s", i, tool, e.Reason), Err: err}
}
