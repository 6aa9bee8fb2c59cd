package slack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// eventEnvelope is the outer Events API payload.
type eventEnvelope struct {
	Type    string          `json:"type"`
	TeamID  string          `json:"team_id"`
	EventID string          `json:"event_id"`
	Event   json.RawMessage `json:"event"`
}

// messageEvent is the part of a message or app_mention event Tollgate reads.
type messageEvent struct {
	Type        string `json:"type"`
	Subtype     string `json:"subtype"`
	User        string `json:"user"`
	BotID       string `json:"bot_id"`
	Text        string `json:"text"`
	TS          string `json:"ts"`
	ThreadTS    string `json:"thread_ts"`
	Channel     string `json:"channel"`
	ChannelType string `json:"channel_type"`
	Team        string `json:"team"`
	UserTeam    string `json:"user_team"` // the sender's home workspace (Slack Connect)
}

// acceptEvent handles one Events API payload (HTTP or Socket Mode): an
// event id seen before is skipped (duplicate); a message that is a turn is
// published before the answer. An error is transient: nothing was
// published, and the event's record is removed so Slack's retry is handled.
func (t *Transport) acceptEvent(ctx context.Context, raw []byte) (answer, error) {
	var env eventEnvelope
	var ev messageEvent
	if json.Unmarshal(raw, &env) != nil || env.Type != "event_callback" || env.EventID == "" ||
		json.Unmarshal(env.Event, &ev) != nil {
		return answer{status: http.StatusBadRequest, reason: t.refuse(ReasonMalformed)}, nil
	}
	key := hashKey("event", env.TeamID, env.EventID)
	fresh, err := t.core.MarkSeen(ctx, key)
	if err != nil {
		return answer{}, err
	}
	if !fresh {
		return answer{reason: t.refuse(ReasonDuplicate)}, nil
	}
	reason, err := t.inbound(ctx, env.TeamID, &ev)
	if err != nil {
		t.core.Unmark(key)
		return answer{}, err
	}
	if reason != "" {
		t.refuse(reason)
	}
	return answer{reason: reason}, nil
}

// inbound publishes ev as an InboundMessage if it is a turn, or returns why
// it is not.
func (t *Transport) inbound(ctx context.Context, team string, ev *messageEvent) (string, error) {
	if ev.Team != "" && team == "" {
		team = ev.Team
	}
	switch {
	case ev.BotID != "" || ev.Subtype == "bot_message" || (ev.User != "" && ev.User == t.cfg.BotUserID):
		return ReasonBotMessage, nil
	case ev.Type != "message" && ev.Type != "app_mention":
		return ReasonIgnored, nil
	case ev.Subtype != "" && ev.Subtype != "thread_broadcast", ev.User == "", ev.TS == "", ev.Channel == "", team == "":
		return ReasonIgnored, nil
	}
	thread := ev.ThreadTS
	if thread == "" {
		thread = ev.TS
	}
	threadKey := hashKey("thread", team, ev.Channel, thread)
	kind, err := t.kinds.kind(ctx, ev.Channel, ev.ChannelType)
	if err != nil {
		return "", err
	}
	switch {
	case ev.Type == "app_mention", kind == schemas.ChannelDM:
	case ev.ThreadTS != "":
		// A reply in a channel thread: a turn only in a thread Tollgate
		// serves (one that started with a mention).
		p, _, err := t.core.Record(ctx, threadKey)
		if err != nil {
			return "", err
		}
		if p == nil {
			return ReasonIgnored, nil
		}
	default:
		return ReasonIgnored, nil
	}
	m := &schemas.InboundMessage{
		Transport: Name,
		MessageID: team + ":" + ev.Channel + ":" + ev.TS,
		SessionID: "slack:" + team + ":" + ev.Channel + ":" + thread,
		Sender:    schemas.Sender{ID: userTeam(team, ev.UserTeam) + ":" + ev.User, Kind: schemas.SenderUser, Verified: true},
		Channel:   schemas.Channel{ID: ev.Channel, Kind: kind, Thread: thread},
		// The mention that addressed Tollgate is not part of the request.
		Text:   strings.TrimSpace(strings.ReplaceAll(ev.Text, "<@"+t.cfg.BotUserID+">", "")),
		SentAt: slackTime(ev.TS),
	}
	if t.cfg.ProposeCalls != nil {
		m.Calls = t.cfg.ProposeCalls(m.Text)
	}
	if kind != schemas.ChannelDM {
		if err := t.core.PutRecord(ctx, threadKey, &chat.Record{Channel: ev.Channel, MessageID: thread, At: t.cfg.Now()}, 0); err != nil &&
			!errors.Is(err, chat.ErrWritten) {
			return "", err
		}
	}
	return t.core.PublishInbound(ctx, m)
}

// userTeam is the workspace a user belongs to: their own (a Slack
// Connect channel's members come from several), else the event's.
func userTeam(team, own string) string {
	if own != "" {
		return own
	}
	return team
}

// slackTime reads a Slack ts ("1700000000.000100").
func slackTime(ts string) time.Time {
	sec, frac, _ := strings.Cut(ts, ".")
	s, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}
	}
	us, _ := strconv.ParseInt(frac, 10, 64)
	return time.Unix(s, us*1000).UTC()
}

// kindCache maps conversations to channel kinds: from the event's
// channel_type when it has one, else conversations.info (cached).
type kindCache struct {
	api *slack.Client
	mu  sync.Mutex
	m   map[string]schemas.ChannelKind
}

func (c *kindCache) kind(ctx context.Context, channel, channelType string) (schemas.ChannelKind, error) {
	switch channelType {
	case "im":
		return schemas.ChannelDM, nil
	case "mpim", "group":
		return schemas.ChannelPrivate, nil
	case "channel":
		return schemas.ChannelPublic, nil
	}
	c.mu.Lock()
	k, ok := c.m[channel]
	c.mu.Unlock()
	if ok {
		return k, nil
	}
	info, err := c.api.GetConversationInfoContext(ctx, &slack.GetConversationInfoInput{ChannelID: channel})
	if err != nil {
		return "", fmt.Errorf("slack: conversations.info %s: %w", channel, err)
	}
	switch {
	case info.IsIM:
		k = schemas.ChannelDM
	case info.IsMpIM, info.IsPrivate, info.IsGroup:
		k = schemas.ChannelPrivate
	default:
		k = schemas.ChannelPublic
	}
	c.mu.Lock()
	c.m[channel] = k
	c.mu.Unlock()
	return k, nil
}
