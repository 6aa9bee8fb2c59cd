package ingest

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

// HandleStep takes one step batch of the planner (topology.SubjectTurnStep,
// consumer topology.ConsumerIngestSteps) to its session's accepted subject,
// so that accepted turns keep one publisher: ingest. It adds no authority:
// the step batch is forwarded only as the planner turn's own work, under the
// TurnContext ingest sealed for that turn, unchanged. A step batch is
// forwarded only when
//
//   - it decodes as a current AcceptedTurn within the input limits;
//   - its turn id is of the form schemas.PlannerStepTurnID(root, n) and is
//     the last token of the subject it was stored on, and Origin is root;
//   - its TurnContext verifies (seal.KeyRing.Verify) and is root's own
//     (TurnContext.TurnID == root: the context the planner turn was
//     accepted with, not one of another turn or of a follow-up);
//   - it holds at least one call, and no follow-up fields (NotBefore,
//     FollowUpDepth), which a step batch never has.
//
// Otherwise it fails with a *schemas.Error (INVALID_INPUT,
// TURN_CONTEXT_MISMATCH, or Verify's codes), a permanent error: the runner
// dead-letters the message and nothing is published. The forwarded turn is
// byte for byte the AcceptedTurn the planner stored and ingest checked,
// published on
// topology.AcceptedSubject of the context's session key with message id
// topology.AcceptedMsgID of its turn id; the executor's KV create makes it
// one batch however often it is forwarded.
func (in *Ingest) HandleStep(ctx context.Context, m jetstream.Msg) error {
	t, err := in.CheckStep(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	subj := topology.AcceptedSubject(schemas.SessionKeyOf(t.Context))
	// The bytes checked are the bytes published: no second encoding.
	if err := bus.PublishRaw(ctx, in.cfg.JS, subj, topology.AcceptedMsgID(t.TurnID), m.Data(), nil); err != nil {
		return err
	}
	in.cfg.Logger.Debug("step batch accepted", "turn", t.TurnID, "origin", t.Origin, "calls", len(t.Calls))
	return nil
}

// CheckStep is HandleStep's rule: whether data, stored on subject, is a
// planner step batch ingest forwards, and which turn. It returns the
// decoded turn, or a *schemas.Error.
func (in *Ingest) CheckStep(subject string, data []byte) (*schemas.AcceptedTurn, error) {
	t, err := schemas.Decode[schemas.AcceptedTurn](data)
	if err != nil {
		return nil, err
	}
	root, _, ok := schemas.PlannerStepOf(t.TurnID)
	switch {
	case !ok:
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "turn %q is not a planner step batch", t.TurnID)
	case subject != topology.StepSubject(t.TurnID):
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "step batch %s arrived on %s (want %s)", t.TurnID, subject, topology.StepSubject(t.TurnID))
	case t.Origin != root:
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "step batch %s names origin %q, not %q", t.TurnID, t.Origin, root)
	case len(t.Calls) == 0:
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "step batch %s holds no calls", t.TurnID)
	case !t.NotBefore.IsZero() || t.FollowUpDepth != 0:
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "step batch %s carries follow-up fields", t.TurnID)
	}
	if err := in.cfg.Keys.Verify(t.Context); err != nil {
		return nil, err
	}
	if t.Context.TurnID != root {
		return nil, schemas.Errorf(schemas.CodeTurnContextMismatch, "step batch %s carries the TurnContext of turn %q, not of %q", t.TurnID, t.Context.TurnID, root)
	}
	return t, nil
}
