package slack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/slack-go/slack"

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

// permanent turns a Slack API refusal (an error answer, not a transport
// failure or a rate limit) into a coded error: dead-lettered, not retried.
func permanent(what string, err error) error {
	var se slack.SlackErrorResponse
	if errors.As(err, &se) {
		return schemas.Errorf(schemas.CodeChatUndeliverable, "slack: %s: %w", what, err)
	}
	return fmt.Errorf("slack: %s: %w", what, err)
}

// prompt posts the prompt of a pending approval of a slack turn, once.
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
	channel, thread, kind, err := t.promptTarget(ctx, rec.Context)
	if err != nil {
		return err
	}
	var ts string
	err = t.poster.do(ctx, channel, func() error {
		var err error
		_, ts, err = t.cfg.API.PostMessageContext(ctx, channel,
			slack.MsgOptionText(promptText(rec), false), slack.MsgOptionBlocks(promptBlocks(rec)...), slack.MsgOptionTS(thread))
		return err
	})
	if err != nil {
		return permanent("post prompt "+rec.ApprovalID, err)
	}
	t.delivered.WithLabelValues("prompt").Inc()
	p := &post{Channel: channel, TS: ts, ApprovalID: rec.ApprovalID, Tool: rec.Tool, Digest: rec.ArgsDigest, Kind: kind, At: t.cfg.Now().UTC()}
	if err := t.putPost(ctx, promptKey(rec.ApprovalID), p, 0); err != nil && !errors.Is(err, errWritten) {
		return err
	}
	return nil
}

// promptTarget is where a prompt goes: a personal-audience prompt into
// the requester's DM (in the turn's thread when the turn came from that
// DM), never a shared channel; any other into the turn's channel and
// thread.
func (t *Transport) promptTarget(ctx context.Context, c *schemas.TurnContext) (channel, thread string, kind schemas.ChannelKind, err error) {
	if c.Audience != schemas.AudiencePersonal {
		return c.Channel.ID, c.Channel.Thread, c.Channel.Kind, nil
	}
	_, user := teamUser(c.Requester.SenderID)
	im, _, _, err := t.cfg.API.OpenConversationContext(ctx, &slack.OpenConversationParameters{Users: []string{user}, ReturnIM: true})
	if err != nil {
		return "", "", "", permanent("conversations.open for the requester", err)
	}
	if im.ID == c.Channel.ID {
		thread = c.Channel.Thread
	}
	return im.ID, thread, schemas.ChannelDM, nil
}

// closePrompt updates a posted prompt once its approval left pending.
func (t *Transport) closePrompt(ctx context.Context, ev *schemas.DecidedEvent) error {
	p, rev, err := t.getPost(ctx, promptKey(ev.ApprovalID))
	if err != nil || p == nil || p.Closed {
		return err
	}
	err = t.poster.do(ctx, p.Channel, func() error {
		_, _, _, err := t.cfg.API.UpdateMessageContext(ctx, p.Channel, p.TS,
			slack.MsgOptionText(statusWord(ev.Status)+": "+p.Tool, false), slack.MsgOptionBlocks(closedBlocks(p, ev)...))
		return err
	})
	if err != nil {
		return permanent("update prompt "+ev.ApprovalID, err)
	}
	t.delivered.WithLabelValues("close").Inc()
	p.Closed = true
	// errWritten: a concurrent close won; the message shows a decided state.
	if err := t.putPost(ctx, promptKey(ev.ApprovalID), p, rev); err != nil && !errors.Is(err, errWritten) {
		return err
	}
	return nil
}

// DeliverOutcome posts a turn's results into its reply target's thread,
// once per turn (record outcome.<turn>): only for a slack reply target
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
// target's thread, once per turn (record reply.<turn>), under the same
// rules as DeliverOutcome. It is what the transport does with a
// ReplyEvent (tollgate.event.turn.reply.<turn>). The text is posted with
// & < > escaped (escape): no mention, no link markup.
func (t *Transport) DeliverReply(ctx context.Context, r *schemas.ReplyEvent) error {
	if r.Reply.Transport != Name {
		return nil
	}
	// The model's text is the model's, which a prompt injection may
	// steer: escaped, it can neither mention (<!channel>) nor disguise a
	// link (<http://evil|bank.com>).
	text, _ := truncate(escape(r.Text), 39000)
	return t.once(ctx, "reply."+r.TurnID, "reply", r.Reply.Channel, r.Audience, text)
}

// once posts text into ch's thread unless record key says it was posted.
func (t *Transport) once(ctx context.Context, key, kind string, ch schemas.Channel, audience schemas.Audience, text string) error {
	if !audience.Admits(ch.Kind) || ch.ID == "" {
		t.refuse(ReasonNowhere)
		return nil
	}
	if p, _, err := t.getPost(ctx, key); err != nil || p != nil {
		return err
	}
	var ts string
	err := t.poster.do(ctx, ch.ID, func() error {
		var err error
		_, ts, err = t.cfg.API.PostMessageContext(ctx, ch.ID, slack.MsgOptionText(text, false), slack.MsgOptionTS(ch.Thread))
		return err
	})
	if err != nil {
		return permanent("post "+key, err)
	}
	t.delivered.WithLabelValues(kind).Inc()
	if err := t.putPost(ctx, key, &post{Channel: ch.ID, TS: ts, At: t.cfg.Now().UTC()}, 0); err != nil && !errors.Is(err, errWritten) {
		return err
	}
	return nil
}

// rejected tells the clicker why the approver refused their decision,
// ephemerally, once per decision. The prompt stays as it is.
func (t *Transport) rejected(ctx context.Context, r *schemas.DecisionRejected) error {
	if !strings.HasPrefix(r.DecisionID, DecisionPrefix) {
		return nil
	}
	p, _, err := t.getPost(ctx, promptKey(r.ApprovalID))
	if err != nil || p == nil {
		return err
	}
	_, user := teamUser(strings.TrimPrefix(r.Principal, Name+":"))
	key := hashKey("rejected", r.DecisionID)
	if done, _, err := t.getPost(ctx, key); err != nil || done != nil {
		return err
	}
	if err := t.ephemeral(ctx, p.Channel, user, fmt.Sprintf("%s: %s", r.Code, r.Reason)); err != nil {
		return permanent("ephemeral rejection", err)
	}
	if err := t.putPost(ctx, key, &post{Channel: p.Channel, At: t.cfg.Now().UTC()}, 0); err != nil && !errors.Is(err, errWritten) {
		return err
	}
	return nil
}
