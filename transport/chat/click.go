package chat

import (
	"context"
	"fmt"
	"strings"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Click is a button press on a prompt as the platform reports it: the
// approval and digest its button names, and the message it was on.
type Click struct {
	ApprovalID, Digest string
	Channel, MessageID string
	// DigestPrefix: Digest may be a leading part of the approval's
	// digest (a platform whose button ids are too short for a whole one);
	// else it must be all of it.
	DigestPrefix bool
}

// Target is a checked click: the approval and its prompt.
type Target struct {
	Rec    *schemas.ApprovalRecord
	Prompt *Record
}

// Check binds a click to an approval: the clicked message is the
// approval's prompt, and the button's digest is the approval's. It
// returns the target, or ReasonActionMismatch (nothing may be published);
// an error is transient.
func (t *Transport[M]) Check(ctx context.Context, c Click) (*Target, string, error) {
	if !schemas.ValidKey(c.ApprovalID) || c.Digest == "" {
		return nil, ReasonActionMismatch, nil
	}
	p, _, err := t.Record(ctx, PromptKey(c.ApprovalID))
	if err != nil {
		return nil, "", err
	}
	digestOK := p != nil && (p.Digest == c.Digest || c.DigestPrefix && strings.HasPrefix(p.Digest, c.Digest))
	if !digestOK || p.Channel != c.Channel || p.MessageID != c.MessageID {
		return nil, ReasonActionMismatch, nil
	}
	rec, err := t.Approval(ctx, c.ApprovalID)
	if err != nil {
		return nil, "", err
	}
	if rec == nil || rec.ArgsDigest != p.Digest {
		return nil, ReasonActionMismatch, nil
	}
	return &Target{Rec: rec, Prompt: p}, "", nil
}

// Undecidable applies the "still decidable" rule
// (schemas.ApprovalRecord.Decidable) to a click's approval: when it can
// no longer be decided it counts ReasonNotPending and returns the notice
// the clicker alone is shown (the code and the status); nothing may be
// published then. The notice is not a rejection (KindRejection).
func (t *Transport[M]) Undecidable(rec *schemas.ApprovalRecord) (notice string, closed bool) {
	err := rec.Decidable(t.Now())
	if err == nil {
		return "", false
	}
	t.Refuse(ReasonNotPending)
	return string(schemas.CodeOf(err)) + ": this approval can no longer be decided (" + string(rec.Status) + ").", true
}

// NewDecision is the decision of decider on tg with option (and note, a
// deny reason, cut to schemas.MaxNoteBytes on a rune boundary), in the
// prompt's channel, identified by the click's parts (DecisionID). The
// decider is who the platform authenticated; the approver checks who may
// decide.
func (t *Transport[M]) NewDecision(tg *Target, decider schemas.Sender, option, note string, parts ...string) *schemas.Decision {
	note, _ = Truncate(note, schemas.MaxNoteBytes)
	return &schemas.Decision{
		DecisionID: t.DecisionID(parts...),
		ApprovalID: tg.Rec.ApprovalID,
		Transport:  t.cfg.Name,
		Decider:    decider,
		Channel:    &schemas.Channel{ID: tg.Prompt.Channel, Kind: tg.Prompt.Kind},
		Option:     option,
		ArgsDigest: tg.Rec.ArgsDigest,
		Note:       note,
		SentAt:     t.Now().UTC(),
	}
}

// Publish submits d to the approver (pipeline/submit: a request on
// tollgate.decide.<name>.<approval>, stored on
// tollgate.decision.submit.<name>.<approval> with its id as the message
// id when no approver answers). A retried click is one decision: the
// approver answers a repeat as an idempotent success. d.Transport must be
// the transport's name.
func (t *Transport[M]) Publish(ctx context.Context, d *schemas.Decision) error {
	if d.Transport != t.cfg.Name {
		return fmt.Errorf("chat %s: a decision from transport %q", t.cfg.Name, d.Transport)
	}
	_, err := submit.Decision(ctx, t.cfg.JS, d)
	return err
}

// PublishInbound stores m (of this transport) on
// tollgate.inbound.<name>.<session key>, deduplicated by its message id,
// trying again while the stream does not answer until ctx ends
// (bus.Store).
// A message the bus refuses as permanently bad is logged and reported as
// ReasonMalformed (counted); any other error is transient.
func (t *Transport[M]) PublishInbound(ctx context.Context, m *schemas.InboundMessage) (string, error) {
	subject := topology.InboundSubject(t.cfg.Name, m.SessionID)
	data, err := schemas.Encode(m)
	if err == nil {
		_, err = bus.Store(ctx, t.cfg.JS, subject, topology.InboundMsgID(t.cfg.Name, m.MessageID), data, nil)
	}
	if err != nil {
		if schemas.Permanent(err) {
			t.log.Warn(t.cfg.Name+": message not publishable", "code", schemas.CodeOf(err), "err", err)
			return ReasonMalformed, nil
		}
		return "", err
	}
	return "", nil
}
