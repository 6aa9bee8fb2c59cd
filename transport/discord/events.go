package discord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// handleEvent is the consumer's handler (chat.HandleEvent). Every handler
// is idempotent: a redelivered or replayed event finds its KV record and
// posts nothing.
func (t *Transport) handleEvent(ctx context.Context, m jetstream.Msg) error {
	return chat.HandleEvent(ctx, Name, chat.Handlers{
		Prompt: t.prompt, ClosePrompt: t.closePrompt, Outcome: t.DeliverOutcome, Reply: t.DeliverReply, Rejected: t.rejected,
	}, m)
}

// prompt posts the prompt of a pending approval of a discord turn, once.
func (t *Transport) prompt(ctx context.Context, rec *schemas.ApprovalRecord) error {
	if rec.Context == nil || rec.Context.Transport != Name || rec.Status != schemas.ApprovalPending {
		return nil
	}
	if p, _, err := t.getPost(ctx, promptKey(rec.ApprovalID)); err != nil || p != nil {
		return err
	}
	// A replayed announcement of an approval decided since: no prompt.
	if cur, err := t.approval(ctx, rec.ApprovalID); err != nil {
		return err
	} else if cur != nil && cur.Status != schemas.ApprovalPending {
		return nil
	}
	channel, kind, err := t.promptTarget(ctx, rec.Context)
	if err != nil {
		return err
	}
	id, err := t.api.send(ctx, channel, promptMessage(rec))
	if err != nil {
		return permanent("post prompt "+rec.ApprovalID, err)
	}
	t.delivered.WithLabelValues("prompt").Inc()
	p := &post{Channel: channel, MessageID: id, ApprovalID: rec.ApprovalID, Tool: rec.Tool, Digest: rec.ArgsDigest, Kind: kind, At: t.cfg.Now().UTC()}
	if err := t.putPost(ctx, promptKey(rec.ApprovalID), p, 0); err != nil && !errors.Is(err, chat.ErrWritten) {
		return err
	}
	return nil
}

// promptTarget is where a prompt goes: a personal-audience prompt into
// the requester's DM channel, never a guild channel; any other into the
// turn's channel.
func (t *Transport) promptTarget(ctx context.Context, c *schemas.TurnContext) (string, schemas.ChannelKind, error) {
	if c.Audience != schemas.AudiencePersonal {
		return c.Channel.ID, c.Channel.Kind, nil
	}
	dm, err := t.api.dm(ctx, c.Requester.SenderID)
	if err != nil {
		return "", "", permanent("open the requester's DM", err)
	}
	return dm, schemas.ChannelDM, nil
}

// closePrompt edits a posted prompt still open once its approval left
// pending, with the bot token (interaction tokens expire).
func (t *Transport) closePrompt(ctx context.Context, ev *schemas.DecidedEvent) error {
	p, rev, err := t.getPost(ctx, promptKey(ev.ApprovalID))
	if err != nil || p == nil || p.Closed {
		return err
	}
	if err := t.api.edit(ctx, p.Channel, p.MessageID, closedMessage(p, ev.Status, ev.Decision, ev.At)); err != nil {
		return permanent("update prompt "+ev.ApprovalID, err)
	}
	t.delivered.WithLabelValues("close").Inc()
	p.Closed = true
	// chat.ErrWritten: a concurrent close won; the message shows a decided state.
	if err := t.putPost(ctx, promptKey(ev.ApprovalID), p, rev); err != nil && !errors.Is(err, chat.ErrWritten) {
		return err
	}
	return nil
}

// DeliverOutcome posts a turn's results into its reply target's channel,
// once per turn (record outcome.<turn>): only for a discord reply target
// whose channel is no wider than the outcome's audience, never for an
// outcome with audience "". Outcomes of the planner's step batches are
// the planner's: its reply (DeliverReply) is what the user sees.
func (t *Transport) DeliverOutcome(ctx context.Context, o *schemas.TurnOutcome) error {
	if o.Reply.Transport != Name {
		return nil
	}
	if _, _, step := schemas.PlannerStepOf(o.TurnID); step {
		return nil
	}
	return t.once(ctx, "outcome."+o.TurnID, "outcome", o.Reply.Channel, o.Audience, outcomeText(o))
}

// DeliverReply posts the planner's reply to a turn into the reply
// target's channel, once per turn (record reply.<turn>), under the same
// rules as DeliverOutcome. It is what the transport does with a
// ReplyEvent (tollgate.event.turn.reply.<turn>).
func (t *Transport) DeliverReply(ctx context.Context, r *schemas.ReplyEvent) error {
	if r.Reply.Transport != Name {
		return nil
	}
	return t.once(ctx, "reply."+r.TurnID, "reply", r.Reply.Channel, r.Audience, replyText(r.Text))
}

// once posts text into ch unless record key says it was posted.
func (t *Transport) once(ctx context.Context, key, kind string, ch schemas.Channel, audience schemas.Audience, body string) error {
	if !audience.Admits(ch.Kind) || ch.ID == "" {
		t.refuse(ReasonNowhere)
		return nil
	}
	if p, _, err := t.getPost(ctx, key); err != nil || p != nil {
		return err
	}
	id, err := t.api.send(ctx, ch.ID, text(body))
	if err != nil {
		return permanent("post "+key, err)
	}
	t.delivered.WithLabelValues(kind).Inc()
	if err := t.putPost(ctx, key, &post{Channel: ch.ID, MessageID: id, At: t.cfg.Now().UTC()}, 0); err != nil && !errors.Is(err, chat.ErrWritten) {
		return err
	}
	return nil
}

// rejected tells the clicker why the approver refused their decision, as
// an ephemeral follow-up on their click, once per decision, while the
// click's token lives. The prompt stays as it is.
func (t *Transport) rejected(ctx context.Context, r *schemas.DecisionRejected) error {
	if !strings.HasPrefix(r.DecisionID, DecisionPrefix) {
		return nil
	}
	ck, _, err := t.getPost(ctx, clickKey(r.DecisionID))
	if err != nil || ck == nil {
		return err
	}
	key := chat.HashKey("rejected", r.DecisionID)
	if done, _, err := t.getPost(ctx, key); err != nil || done != nil {
		return err
	}
	if t.cfg.Now().Sub(ck.At) > tokenLife-time.Minute {
		t.log.Info("discord: rejection not shown: the click's token expired", "decision", r.DecisionID, "code", r.Code)
		return nil
	}
	if err := t.api.followup(ctx, ck.App, ck.Token, ephemeral(fmt.Sprintf("%s: %s", r.Code, r.Reason))); err != nil {
		return permanent("ephemeral rejection", err)
	}
	t.delivered.WithLabelValues("rejection").Inc()
	if err := t.putPost(ctx, key, &post{Channel: ck.Channel, At: t.cfg.Now().UTC()}, 0); err != nil && !errors.Is(err, chat.ErrWritten) {
		return err
	}
	return nil
}
