package slack_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// socketServer speaks Slack's Socket Mode envelope protocol: hello on
// connect, then the envelopes the test sends; it reports each ack's
// envelope_id.
type socketServer struct {
	srv  *httptest.Server
	send chan any
	acks chan string
}

func newSocketServer(t *testing.T) *socketServer {
	t.Helper()
	s := &socketServer{send: make(chan any, 8), acks: make(chan string, 8)}
	// Slack's client sends Origin https://api.slack.com.
	up := websocket.Upgrader{CheckOrigin: func(r *http.Request) bool { return r.Header.Get("Origin") == "https://api.slack.com" }}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.WriteJSON(map[string]any{"type": "hello", "num_connections": 1, "connection_info": map[string]any{"app_id": "A1"}})
		go func() {
			for {
				var ack struct {
					EnvelopeID string `json:"envelope_id"`
				}
				if err := conn.ReadJSON(&ack); err != nil {
					return
				}
				s.acks <- ack.EnvelopeID
			}
		}()
		for {
			select {
			case m := <-s.send:
				if err := conn.WriteJSON(m); err != nil {
					return
				}
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *socketServer) url() string { return "ws" + strings.TrimPrefix(s.srv.URL, "http") }

// awaitAck waits for the ack of envelope id.
func (s *socketServer) awaitAck(t *testing.T, id string) {
	t.Helper()
	d := jstest.Scale(jstest.Wait)
	timeout := time.After(d)
	var seen []string
	for {
		select {
		case got := <-s.acks:
			if got == id {
				return
			}
			seen = append(seen, got)
		case <-timeout:
			t.Fatalf("timed out after %v: ack of envelope %s: last seen: acks of %q", d, id, seen)
		}
	}
}

// Over Socket Mode an events_api envelope becomes a turn and is
// acknowledged by its envelope_id; Slack's retry of the same event is
// acknowledged and publishes nothing; an interactive envelope with an
// action Tollgate never sent is acknowledged and publishes nothing; a
// click on the prompt decides it.
func TestSocketModeEnvelopes(t *testing.T) {
	r := startRig(t)
	ws := newSocketServer(t)
	r.slack.mu.Lock()
	r.slack.wsURL = ws.url()
	r.slack.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.tr.RunSocketMode(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	const ch, ts = "DU1", "1700000050.000100"
	var ev map[string]any
	_ = json.Unmarshal(eventBody("EvS", dm("U1", ch, ts, "write socket.txt")), &ev)
	ws.send <- map[string]any{"envelope_id": "env-1", "type": "events_api", "payload": ev}
	ws.awaitAck(t, "env-1")
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	p := r.promptOf(t, id)

	inbound := r.msgs(t, "TOLLGATE_INBOUND")
	ws.send <- map[string]any{"envelope_id": "env-2", "type": "events_api", "retry_attempt": 1, "payload": ev}
	ws.awaitAck(t, "env-2")
	if got := r.msgs(t, "TOLLGATE_INBOUND"); got != inbound {
		t.Errorf("Slack's retry published %d inbound messages", got-inbound)
	}

	click := func(actionID, actionTS string) map[string]any {
		var payload map[string]any
		body := clickBody("U1", ch, p.ts, actionID, buttonValue(t, p, "tollgate_approve"), actionTS)
		_ = json.Unmarshal([]byte(mustUnquotePayload(t, body)), &payload)
		return payload
	}
	decisions := r.msgs(t, "TOLLGATE_DECISIONS")
	ws.send <- map[string]any{"envelope_id": "env-3", "type": "interactive", "payload": click("tollgate_launch", "5.1")}
	ws.awaitAck(t, "env-3")
	if got := r.msgs(t, "TOLLGATE_DECISIONS"); got != decisions {
		t.Errorf("an unknown action published %d decisions", got-decisions)
	}
	ws.send <- map[string]any{"envelope_id": "env-4", "type": "interactive", "payload": click("tollgate_approve", "5.2")}
	ws.awaitAck(t, "env-4")
	r.awaitStatus(t, id, schemas.ApprovalApproved)
	r.slack.await(t, 1, "chat.update", func(c call) bool { return c.form.Get("ts") == p.ts })
}

// mustUnquotePayload is the JSON payload of a form-encoded interaction body.
func mustUnquotePayload(t *testing.T, body []byte) string {
	t.Helper()
	v, err := url.ParseQuery(string(body))
	if err != nil {
		t.Fatal(err)
	}
	return v.Get("payload")
}
