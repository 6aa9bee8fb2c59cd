package slack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// message is a Slack message: its notification text and its blocks
// (none: the text is the message).
type message struct {
	text   string
	blocks []slack.Block
}

// platform is Slack's chat.Platform: the Web API client and the Block Kit
// renderer.
type platform Transport

var _ chat.Platform[message] = (*platform)(nil)

func (m message) options(thread string) []slack.MsgOption {
	opts := []slack.MsgOption{slack.MsgOptionText(m.text, false)}
	if m.blocks != nil {
		opts = append(opts, slack.MsgOptionBlocks(m.blocks...))
	}
	if thread != "" {
		opts = append(opts, slack.MsgOptionTS(thread))
	}
	return opts
}

// Permanent turns a Slack API refusal (an error answer, not a transport
// failure or a rate limit) into a coded error: dead-lettered, not retried.
func (p *platform) Permanent(what string, err error) error {
	var se slack.SlackErrorResponse
	if errors.As(err, &se) {
		return schemas.Errorf(schemas.CodeChatUndeliverable, "slack: %s: %w", what, err)
	}
	return fmt.Errorf("slack: %s: %w", what, err)
}

// PromptTarget: a personal-audience prompt goes into the requester's DM
// (conversations.open; in the turn's thread when the turn came from that
// DM), never a shared channel; any other into the turn's channel and
// thread.
func (p *platform) PromptTarget(ctx context.Context, c *schemas.TurnContext) (chat.Place, error) {
	if c.Audience != schemas.AudiencePersonal {
		return chat.Place{Channel: c.Channel.ID, Thread: c.Channel.Thread, Kind: c.Channel.Kind}, nil
	}
	_, user := teamUser(c.Requester.SenderID)
	im, _, _, err := p.cfg.API.OpenConversationContext(ctx, &slack.OpenConversationParameters{Users: []string{user}, ReturnIM: true})
	if err != nil {
		return chat.Place{}, p.Permanent("conversations.open for the requester", err)
	}
	at := chat.Place{Channel: im.ID, Kind: schemas.ChannelDM}
	if im.ID == c.Channel.ID {
		at.Thread = c.Channel.Thread
	}
	return at, nil
}

// Post posts m (chat.postMessage) in its channel's turn.
func (p *platform) Post(ctx context.Context, at chat.Place, m message) (string, error) {
	var ts string
	err := p.poster.do(ctx, at.Channel, func() error {
		var err error
		_, ts, err = p.cfg.API.PostMessageContext(ctx, at.Channel, m.options(at.Thread)...)
		return err
	})
	return ts, err
}

// Edit updates message ts in place (chat.update).
func (p *platform) Edit(ctx context.Context, channel, ts string, m message) error {
	return p.poster.do(ctx, channel, func() error {
		_, _, _, err := p.cfg.API.UpdateMessageContext(ctx, channel, ts, m.options("")...)
		return err
	})
}

// Ephemeral shows a rejection to the decider in the channel of the
// approval's prompt (chat.postEphemeral).
func (p *platform) Ephemeral(ctx context.Context, r *schemas.DecisionRejected, text string) (string, error) {
	pr, _, err := p.core.Record(ctx, chat.PromptKey(r.ApprovalID))
	if err != nil || pr == nil {
		return "", err
	}
	_, user := teamUser(strings.TrimPrefix(r.Principal, Name+":"))
	if err := (*Transport)(p).ephemeral(ctx, pr.Channel, user, text); err != nil {
		return "", err
	}
	return pr.Channel, nil
}

// RenderPrompt renders a pending approval (promptBlocks).
func (p *platform) RenderPrompt(rec *schemas.ApprovalRecord) message {
	return message{text: "Approval needed: " + rec.Tool, blocks: promptBlocks(rec)}
}

// RenderClosed renders a prompt that can no longer be answered
// (closedBlocks).
func (p *platform) RenderClosed(r *chat.Record, status schemas.ApprovalStatus, d *schemas.DecisionInfo, at time.Time) message {
	return message{text: chat.StatusWord(status) + ": " + r.Tool, blocks: closedBlocks(r, status, d, at)}
}

// RenderOutcome renders a turn's results as text.
func (p *platform) RenderOutcome(o *schemas.TurnOutcome) message {
	return message{text: outcomeText(o)}
}

// RenderReply is the planner's reply with & < > escaped: the model's
// text, which a prompt injection may steer, can neither mention
// (<!channel>) nor disguise a link (<http://evil|bank.com>).
func (p *platform) RenderReply(text string) message {
	text, _ = chat.Truncate(escape(text), 39000)
	return message{text: text}
}
