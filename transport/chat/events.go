package chat

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Handlers are what a chat transport does with each event its consumer on
// TOLLGATE_EVENTS receives. Each must be idempotent: a redelivered or
// replayed event finds its posted record and posts nothing.
type Handlers struct {
	// Prompt posts the prompt of an approval requested (its own
	// transport's, pending; others are passed over).
	Prompt func(context.Context, *schemas.ApprovalRecord) error
	// ClosePrompt updates a posted prompt once its approval left pending.
	ClosePrompt func(context.Context, *schemas.DecidedEvent) error
	// Outcome posts a turn's results where its audience allows.
	Outcome func(context.Context, *schemas.TurnOutcome) error
	// Reply posts the planner's reply of a turn.
	Reply func(context.Context, *schemas.ReplyEvent) error
	// Rejected tells a decider the approver refused their decision.
	Rejected func(context.Context, *schemas.DecisionRejected) error
}

// HandleEvent decodes m by its subject and hands it to h's handler of it: the handler of a
// chat transport's events consumer. A payload that does not decode is its
// *schemas.Error (dead-lettered); a subject none handles is
// UNKNOWN_MESSAGE, naming transport.
func HandleEvent(ctx context.Context, transport string, h Handlers, m jetstream.Msg) error {
	subject := m.Subject()
	switch {
	case strings.HasPrefix(subject, topology.SubjectApprovalRequested):
		return deliver(ctx, m, h.Prompt)
	case strings.HasPrefix(subject, topology.SubjectApprovalDecided):
		return deliver(ctx, m, h.ClosePrompt)
	case strings.HasPrefix(subject, topology.SubjectTurnOutcome):
		return deliver(ctx, m, h.Outcome)
	case strings.HasPrefix(subject, topology.SubjectTurnReply):
		return deliver(ctx, m, h.Reply)
	case strings.HasPrefix(subject, topology.SubjectDecisionRejected):
		return deliver(ctx, m, h.Rejected)
	}
	return schemas.Errorf(schemas.CodeUnknownMessage, "%s: subject %s is not handled", transport, subject)
}

func deliver[T any, P schemas.Ptr[T]](ctx context.Context, m jetstream.Msg, f func(context.Context, P) error) error {
	r, err := schemas.Decode[T, P](m.Data())
	if err != nil {
		return err
	}
	return f(ctx, P(r))
}
