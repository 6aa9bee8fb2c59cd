package slack

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Request checks of HTTP mode (chat.ReadSigned).
const (
	// SignatureWindow is how far a request's timestamp may be from the
	// clock, either way.
	SignatureWindow = chat.SignatureWindow
	// answerBudget bounds the work done before a request is answered:
	// Slack wants an answer within 3 seconds.
	answerBudget = chat.AnswerBudget
)

// Sign returns the X-Slack-Signature of body at timestamp ts (Unix
// seconds) under secret: "v0=" + hex HMAC-SHA256 of "v0:<ts>:<body>".
func Sign(secret string, ts int64, body []byte) string {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte("v0:" + strconv.FormatInt(ts, 10) + ":"))
	h.Write(body)
	return "v0=" + hex.EncodeToString(h.Sum(nil))
}

// verify reads and authenticates a request (chat.ReadSigned): a valid v0
// signature (else 401 bad_signature), a timestamp within SignatureWindow
// (else 401 stale_timestamp), not seen before (else 400 replayed). On
// success it returns the body and the replay record's key.
func (t *Transport) verify(ctx context.Context, r *http.Request) (body []byte, key string, status int, reason string) {
	sig := r.Header.Get("X-Slack-Signature")
	body, status, reason = t.core.ReadSigned(r, func(body []byte) (string, bool) {
		ts := r.Header.Get("X-Slack-Request-Timestamp")
		sec, err := strconv.ParseInt(ts, 10, 64)
		return ts, err == nil && t.cfg.SigningSecret != "" && hmac.Equal([]byte(sig), []byte(Sign(t.cfg.SigningSecret, sec, body)))
	})
	if status != 0 {
		return nil, "", status, reason
	}
	key = hashKey("sig", sig)
	fresh, err := t.core.MarkSeen(ctx, key)
	if err != nil {
		t.log.Warn("slack: replay record", "err", err)
		return nil, "", http.StatusServiceUnavailable, "unavailable"
	}
	if !fresh {
		return nil, "", http.StatusBadRequest, t.refuse(ReasonReplayed)
	}
	return body, key, 0, ""
}

// answer is the result of checking one payload.
type answer struct {
	status int    // HTTP status; 0 is 200
	reason string // refusal reason, for the log
	body   []byte // JSON body of a 200, if any
	// after runs once the answer is sent (views, ephemerals, closes).
	after func(context.Context)
}

func (t *Transport) respond(w http.ResponseWriter, key string, a answer, err error) {
	if err != nil {
		// Transient: nothing was done, let Slack retry.
		t.core.Unmark(key)
		t.log.Warn("slack: request failed; Slack will retry it", "err", err)
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	if a.status != 0 && a.status != http.StatusOK {
		http.Error(w, a.reason, a.status)
		return
	}
	if a.body != nil {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(a.body)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	if a.after != nil {
		t.later(a.after)
	}
}

// serveEvents is the Events API endpoint.
func (t *Transport) serveEvents(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), answerBudget)
	defer cancel()
	body, key, status, reason := t.verify(ctx, r)
	if status != 0 {
		http.Error(w, reason, status)
		return
	}
	var outer struct {
		Type      string `json:"type"`
		Challenge string `json:"challenge"`
	}
	if json.Unmarshal(body, &outer) != nil {
		http.Error(w, t.refuse(ReasonMalformed), http.StatusBadRequest)
		return
	}
	if outer.Type == "url_verification" {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(outer.Challenge))
		return
	}
	a, err := t.acceptEvent(ctx, body)
	t.respond(w, key, a, err)
}

// serveInteractivity is the interactivity endpoint (block actions, view
// submissions), a form with the JSON in "payload".
func (t *Transport) serveInteractivity(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), answerBudget)
	defer cancel()
	body, key, status, reason := t.verify(ctx, r)
	if status != 0 {
		http.Error(w, reason, status)
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		http.Error(w, t.refuse(ReasonMalformed), http.StatusBadRequest)
		return
	}
	a, err := t.acceptInteraction(ctx, []byte(form.Get("payload")))
	t.respond(w, key, a, err)
}

// parseInteraction decodes an interaction payload.
func parseInteraction(raw []byte) (*slack.InteractionCallback, bool) {
	var cb slack.InteractionCallback
	if err := json.Unmarshal(raw, &cb); err != nil {
		return nil, false
	}
	return &cb, true
}
