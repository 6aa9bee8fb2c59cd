package discord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// rest calls Discord's REST API with the bot token, one request at a time
// per channel, waiting out 429s for their Retry-After (chat.Queue).
type rest struct {
	base  string
	token string // never logged
	hc    *http.Client
	queue *chat.Queue
}

func newREST(base, token string, hc *http.Client, log *slog.Logger) *rest {
	return &rest{base: base, token: token, hc: hc, queue: chat.NewQueue(log.With("transport", Name), func(err error) (time.Duration, bool) {
		var rl *rateLimited
		if errors.As(err, &rl) {
			return rl.after, true
		}
		return 0, false
	})}
}

// apiError is a REST answer other than 2xx and 429.
type apiError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("discord: %s %s: %d %s", e.Method, e.Path, e.Status, e.Body)
}

// rateLimited is a 429 answer.
type rateLimited struct{ after time.Duration }

func (e *rateLimited) Error() string { return "discord: rate limited for " + e.after.String() }

// call sends one request in channel's queue ("" for none): body is
// JSON-encoded, a JSON answer decoded into out (if not nil). bot adds the
// bot token (interaction webhooks take none).
func (r *rest) call(ctx context.Context, channel, method, path string, bot bool, body, out any) error {
	return r.queue.Do(ctx, channel, func() error { return r.once(ctx, method, path, bot, body, out) })
}

func (r *rest) once(ctx context.Context, method, path string, bot bool, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bot {
		req.Header.Set("Authorization", "Bot "+r.token)
	}
	req.Header.Set("User-Agent", "DiscordBot (https://github.com/tollgate-dev/tollgate, 1)")
	resp, err := r.hc.Do(req)
	if err != nil {
		return fmt.Errorf("discord: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		return &rateLimited{after: retryAfter(resp.Header.Get("Retry-After"), data)}
	case resp.StatusCode/100 != 2:
		b, _ := truncate(string(data), 300)
		return &apiError{Method: method, Path: path, Status: resp.StatusCode, Body: b}
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("discord: %s %s: answer: %w", method, path, err)
		}
	}
	return nil
}

// retryAfter reads a 429's wait: the Retry-After header (seconds, possibly
// fractional), else the body's retry_after.
func retryAfter(header string, body []byte) time.Duration {
	if s, err := strconv.ParseFloat(header, 64); err == nil {
		return time.Duration(s * float64(time.Second))
	}
	var b struct {
		RetryAfter float64 `json:"retry_after"`
	}
	_ = json.Unmarshal(body, &b)
	return time.Duration(b.RetryAfter * float64(time.Second))
}

// permanent turns a refusal by Discord (a 4xx answer) into a coded error:
// dead-lettered, not retried. Other failures stay transient.
func permanent(what string, err error) error {
	var ae *apiError
	if errors.As(err, &ae) && ae.Status/100 == 4 {
		return schemas.Errorf(schemas.CodeChatUndeliverable, "discord: %s: %w", what, err)
	}
	return fmt.Errorf("discord: %s: %w", what, err)
}

// message is the part of a Discord message Tollgate reads.
type message struct {
	ID        string `json:"id"`
	ChannelID string `json:"channel_id"`
}

// send posts a message into channel.
func (r *rest) send(ctx context.Context, channel string, msg any) (string, error) {
	var m message
	err := r.call(ctx, channel, http.MethodPost, "/channels/"+channel+"/messages", true, msg, &m)
	return m.ID, err
}

// edit replaces a message's content and components.
func (r *rest) edit(ctx context.Context, channel, id string, msg any) error {
	return r.call(ctx, channel, http.MethodPatch, "/channels/"+channel+"/messages/"+id, true, msg, nil)
}

// dm is the id of the DM channel with user (created if needed).
func (r *rest) dm(ctx context.Context, user string) (string, error) {
	var ch struct {
		ID string `json:"id"`
	}
	if err := r.call(ctx, "", http.MethodPost, "/users/@me/channels", true, map[string]string{"recipient_id": user}, &ch); err != nil {
		return "", err
	}
	if ch.ID == "" {
		return "", &apiError{Method: http.MethodPost, Path: "/users/@me/channels", Status: http.StatusBadRequest, Body: "no channel id"}
	}
	return ch.ID, nil
}

// followup sends a follow-up message on an interaction (its token, valid
// 15 minutes).
func (r *rest) followup(ctx context.Context, app, token string, msg any) error {
	return r.call(ctx, "", http.MethodPost, "/webhooks/"+app+"/"+token, false, msg, nil)
}

// channelInfo is the part of a channel Tollgate reads for its kind.
type channelInfo struct {
	ID         string `json:"id"`
	Type       int    `json:"type"`
	GuildID    string `json:"guild_id"`
	ParentID   string `json:"parent_id"`
	Overwrites []struct {
		ID   string `json:"id"`
		Type int    `json:"type"`
		Deny string `json:"deny"`
	} `json:"permission_overwrites"`
}

func (r *rest) channel(ctx context.Context, id string) (*channelInfo, error) {
	var c channelInfo
	if err := r.call(ctx, "", http.MethodGet, "/channels/"+id, true, nil, &c); err != nil {
		return nil, err
	}
	return &c, nil
}
