package discord

import (
	"context"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// platform is Discord's chat.Platform: the REST client and the message
// renderer.
type platform Transport

var _ chat.Platform[*outgoing] = (*platform)(nil)

// Permanent: a refusal by Discord (a 4xx answer) is coded, dead-lettered
// (permanent).
func (p *platform) Permanent(what string, err error) error { return permanent(what, err) }

// PromptTarget: a personal-audience prompt goes into the requester's DM
// channel (POST /users/@me/channels), never a guild channel; any other
// into the turn's channel.
func (p *platform) PromptTarget(ctx context.Context, c *schemas.TurnContext) (chat.Place, error) {
	if c.Audience != schemas.AudiencePersonal {
		return chat.Place{Channel: c.Channel.ID, Kind: c.Channel.Kind}, nil
	}
	dm, err := p.api.dm(ctx, c.Requester.SenderID)
	if err != nil {
		return chat.Place{}, permanent("open the requester's DM", err)
	}
	return chat.Place{Channel: dm, Kind: schemas.ChannelDM}, nil
}

// Post posts m into its channel (threads are channels of their own).
func (p *platform) Post(ctx context.Context, at chat.Place, m *outgoing) (string, error) {
	return p.api.send(ctx, at.Channel, m)
}

// Edit replaces message id with the bot token (interaction tokens expire).
func (p *platform) Edit(ctx context.Context, channel, id string, m *outgoing) error {
	return p.api.edit(ctx, channel, id, m)
}

// Ephemeral shows a rejection as an ephemeral follow-up on the decider's
// click, while the click's token lives (15 minutes; a minute's margin).
func (p *platform) Ephemeral(ctx context.Context, r *schemas.DecisionRejected, text string) (string, error) {
	ck, _, err := p.core.Record(ctx, clickKey(r.DecisionID))
	if err != nil || ck == nil {
		return "", err
	}
	if p.cfg.Now().Sub(ck.At) > tokenLife-time.Minute {
		p.log.Info("discord: rejection not shown: the click's token expired", "decision", r.DecisionID, "code", r.Code)
		return "", nil
	}
	if err := p.api.followup(ctx, ck.App, ck.Token, ephemeral(text)); err != nil {
		return "", err
	}
	return ck.Channel, nil
}

// RenderPrompt renders a pending approval (promptMessage).
func (p *platform) RenderPrompt(rec *schemas.ApprovalRecord) *outgoing { return promptMessage(rec) }

// RenderClosed renders a prompt that can no longer be answered
// (closedMessage).
func (p *platform) RenderClosed(r *chat.Record, status schemas.ApprovalStatus, d *schemas.DecisionInfo, at time.Time) *outgoing {
	return closedMessage(r, status, d, at)
}

// RenderOutcome renders a turn's results.
func (p *platform) RenderOutcome(o *schemas.TurnOutcome) *outgoing { return text(outcomeText(o)) }

// RenderReply renders the planner's reply (replyText).
func (p *platform) RenderReply(s string) *outgoing { return text(replyText(s)) }
