package chat

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Handlers are what a chat transport does with each event its consumer on
// TOLLGATE_EVENTS receives. Each must be idempotent: a redelivered or
// replayed event finds its posted record and posts nothing. (Decisions do
// not come from there: a transport closes a prompt on its approval's
// decided revision in the approvals bucket, Transport.closePrompt.)
type Handlers struct {
	// Prompt posts the prompt of an approval requested (its own
	// transport's, pending; others are passed over).
	Prompt func(context.Context, *schemas.ApprovalRecord) error
	// Outcome posts a turn's results where its audience allows.
	Outcome func(context.Context, *schemas.TurnOutcome) error
	// Reply posts the planner's reply of a turn.
	Reply func(context.Context, *schemas.ReplyEvent) error
	// Rejected tells a decider the approver refused their decision.
	Rejected func(context.Context, *schemas.DecisionRejected) error
}

// HandleEvent decodes m by its subject and hands it to h's handler of it:
// the handler of a chat transport's events consumer. A published
// approval.decided event (which the consumer no longer follows, but may
// still hold from before its filter changed) is acknowledged and passed
// over: the approvals bucket holds the decision, and the transport acts
// on it there. A payload that does not decode is its *schemas.Error
// (dead-lettered); a subject none handles is UNKNOWN_MESSAGE, naming
// transport.
func HandleEvent(ctx context.Context, transport string, h Handlers, m jetstream.Msg) error {
	if strings.HasPrefix(m.Subject(), topology.SubjectApprovalDecided) {
		return nil
	}
	_, rec, err := topology.Read(m.Subject(), m.Data(), topology.RouteApprovalRequested,
		topology.RouteTurnOutcome, topology.RouteTurnReply, topology.RouteDecisionRejected)
	if errors.Is(err, topology.ErrUnrouted) {
		return schemas.Errorf(schemas.CodeUnknownMessage, "%s: subject %s is not handled", transport, m.Subject())
	}
	if err != nil {
		return err
	}
	switch rec := rec.(type) {
	case *schemas.ApprovalRecord:
		return h.Prompt(ctx, rec)
	case *schemas.TurnOutcome:
		return h.Outcome(ctx, rec)
	case *schemas.ReplyEvent:
		return h.Reply(ctx, rec)
	case *schemas.DecisionRejected:
		return h.Rejected(ctx, rec)
	}
	return schemas.Errorf(schemas.CodeUnknownMessage, "%s: subject %s is not handled", transport, m.Subject())
}
