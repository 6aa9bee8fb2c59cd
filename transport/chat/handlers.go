package chat

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tollgate-dev/tollgate/schemas"
)

// PromptKey is the record of approval id's prompt.
func PromptKey(approvalID string) string { return "prompt." + approvalID }

// prompt posts the prompt of a pending approval of the transport's own
// turn, once (record prompt.<approval>). A replayed announcement of an
// approval decided since posts nothing. A decision that comes while the
// prompt is being posted finds no prompt to close (closePrompt): so once
// the record is written the approval is read again, and a decided one has
// its prompt closed here (and on a redelivery that finds the prompt
// posted and still open, in case that read failed).
func (t *Transport[M]) prompt(ctx context.Context, rec *schemas.ApprovalRecord) error {
	if rec.Context == nil || rec.Context.Transport != t.cfg.Name || rec.Status != schemas.ApprovalPending {
		return nil
	}
	if p, _, err := t.Record(ctx, PromptKey(rec.ApprovalID)); err != nil {
		return err
	} else if p != nil {
		if p.Closed {
			return nil
		}
		return t.closeIfDecided(ctx, rec.ApprovalID)
	}
	if cur, err := t.Approval(ctx, rec.ApprovalID); err != nil {
		return err
	} else if cur != nil && cur.Status != schemas.ApprovalPending {
		return nil
	}
	at, err := t.p.PromptTarget(ctx, rec.Context)
	if err != nil {
		return err
	}
	id, err := t.p.Post(ctx, at, t.p.RenderPrompt(rec))
	if err != nil {
		return t.p.Permanent("post prompt "+rec.ApprovalID, err)
	}
	t.Posted(KindPrompt)
	p := &Record{Channel: at.Channel, MessageID: id, ApprovalID: rec.ApprovalID, Tool: rec.Tool, Digest: rec.ArgsDigest, Kind: at.Kind, At: t.Now().UTC()}
	if err := t.PutRecord(ctx, PromptKey(rec.ApprovalID), p, 0); err != nil {
		return t.created(err)
	}
	return t.closeIfDecided(ctx, rec.ApprovalID)
}

// closeIfDecided closes the prompt of approval id (closePrompt) when the
// approvals bucket holds the approval decided.
func (t *Transport[M]) closeIfDecided(ctx context.Context, id string) error {
	cur, err := t.Approval(ctx, id)
	if err != nil {
		return err
	}
	if ev := schemas.DecidedOf(cur); ev != nil {
		return t.closePrompt(ctx, ev)
	}
	return nil
}

// created is nil for a record written, or written first by another worker.
func (t *Transport[M]) created(err error) error {
	if errors.Is(err, ErrWritten) {
		return nil
	}
	return err
}

// closePrompt edits a posted prompt still open once its approval left
// pending (from whatever transport it was decided), with the status, who
// decided, when, and their note: the handler of the transport's
// decisions (decisions.Follower), and of a prompt posted for an approval
// decided meanwhile (prompt). A prompt not posted (yet) is left to prompt.
func (t *Transport[M]) closePrompt(ctx context.Context, ev *schemas.DecidedEvent) error {
	p, rev, err := t.Record(ctx, PromptKey(ev.ApprovalID))
	if err != nil || p == nil || p.Closed {
		return err
	}
	if err := t.p.Edit(ctx, p.Channel, p.MessageID, t.p.RenderClosed(p, ev.Status, ev.Decision, ev.At)); err != nil {
		return t.p.Permanent("update prompt "+ev.ApprovalID, err)
	}
	t.Posted(KindClose)
	p.Closed = true
	// ErrWritten: a concurrent close won; the message shows a decided state.
	return t.created(t.PutRecord(ctx, PromptKey(ev.ApprovalID), p, rev))
}

// MarkClosed records approval id's prompt as closed by the caller (who
// shows it closed some other way, as Discord's answer to a click does)
// and returns the record; nil when there is none or another worker wrote
// it first. It counts a close only when the prompt was open.
func (t *Transport[M]) MarkClosed(ctx context.Context, approvalID string) *Record {
	cur, rev, err := t.Record(ctx, PromptKey(approvalID))
	if err != nil || cur == nil {
		return nil
	}
	if !cur.Closed {
		cur.Closed = true
		if t.PutRecord(ctx, PromptKey(approvalID), cur, rev) != nil {
			return nil
		}
		t.Posted(KindClose)
	}
	return cur
}

// DeliverOutcome posts a turn's results at its reply target, once per
// turn (record outcome.<turn>): only for a reply target of this transport
// whose channel is no wider than the outcome's audience, never for an
// outcome with audience "". Outcomes of the planner's step batches are
// the planner's: its reply (DeliverReply) is what the user sees.
func (t *Transport[M]) DeliverOutcome(ctx context.Context, o *schemas.TurnOutcome) error {
	if o.Reply.Transport != t.cfg.Name {
		return nil
	}
	if _, _, step := schemas.PlannerStepOf(o.TurnID); step {
		return nil
	}
	return t.once(ctx, "outcome."+o.TurnID, KindOutcome, o.Reply.Channel, o.Audience, func() M { return t.p.RenderOutcome(o) })
}

// DeliverReply posts the planner's reply to a turn at its reply target,
// once per turn (record reply.<turn>), under the same rules as
// DeliverOutcome: what the transport does with a ReplyEvent
// (tollgate.event.turn.reply.<turn>).
func (t *Transport[M]) DeliverReply(ctx context.Context, r *schemas.ReplyEvent) error {
	if r.Reply.Transport != t.cfg.Name {
		return nil
	}
	return t.once(ctx, "reply."+r.TurnID, KindReply, r.Reply.Channel, r.Audience, func() M { return t.p.RenderReply(r.Text) })
}

// once posts a message at ch unless record key says it was posted; a
// channel wider than audience (or none) is refused as nowhere.
func (t *Transport[M]) once(ctx context.Context, key, kind string, ch schemas.Channel, audience schemas.Audience, render func() M) error {
	if !audience.Admits(ch.Kind) || ch.ID == "" {
		t.Refuse(ReasonNowhere)
		return nil
	}
	if p, _, err := t.Record(ctx, key); err != nil || p != nil {
		return err
	}
	id, err := t.p.Post(ctx, Place{Channel: ch.ID, Thread: ch.Thread, Kind: ch.Kind}, render())
	if err != nil {
		return t.p.Permanent("post "+key, err)
	}
	t.Posted(kind)
	return t.created(t.PutRecord(ctx, key, &Record{Channel: ch.ID, MessageID: id, At: t.Now().UTC()}, 0))
}

// rejected tells the decider why the approver refused their decision,
// ephemerally (Platform.Ephemeral), once per decision (record
// rejected.<hash>), for decisions this transport published. The prompt
// stays as it is.
func (t *Transport[M]) rejected(ctx context.Context, r *schemas.DecisionRejected) error {
	if !strings.HasPrefix(r.DecisionID, t.DecisionPrefix()) {
		return nil
	}
	key := HashKey("rejected", r.DecisionID)
	if done, _, err := t.Record(ctx, key); err != nil || done != nil {
		return err
	}
	channel, err := t.p.Ephemeral(ctx, r, fmt.Sprintf("%s: %s", r.Code, r.Reason))
	if err != nil {
		return t.p.Permanent("ephemeral rejection", err)
	}
	if channel == "" {
		return nil
	}
	t.Posted(KindRejection)
	return t.created(t.PutRecord(ctx, key, &Record{Channel: channel, At: t.Now().UTC()}, 0))
}
