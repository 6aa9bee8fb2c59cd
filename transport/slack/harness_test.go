package slack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/slack-go/slack"
	"github.com/slack-go/slack/slacktest"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat/chattest"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

const (
	secret  = "test-signing-secret"
	team    = "T1"
	botUser = "UBOT"
)

// call is one Web API call the fake Slack received.
type call struct {
	method string
	form   url.Values
	json   map[string]any
	ts     string // the ts the fake answered with
}

// fakeSlack is slacktest's server with handlers that record the calls
// Tollgate makes, give every posted message a distinct ts, and can answer
// 429 with Retry-After.
type fakeSlack struct {
	srv *slacktest.Server

	mu        sync.Mutex
	calls     []call
	seq       int
	limit429  int                      // answer the next n chat.postMessage calls 429
	convTypes map[string]string        // conversations.info: channel -> "private"/"public"/"im"
	wsURL     string                   // apps.connections.open answers it (Socket Mode)
	delay     map[string]time.Duration // answer method only after this long
	before    map[string]func(call)    // run on each call of method before it is answered
}

func newFakeSlack(t *testing.T) *fakeSlack {
	t.Helper()
	f := &fakeSlack{convTypes: map[string]string{}, delay: map[string]time.Duration{}, before: map[string]func(call){}}
	record := func(method string, answer func(c call) any) func(slacktest.Customize) {
		return func(c slacktest.Customize) {
			c.Handle("/"+method, func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				f.mu.Lock()
				d := f.delay[method]
				f.mu.Unlock()
				time.Sleep(d)
				cl := call{method: method}
				if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
					_ = json.Unmarshal(body, &cl.json)
				} else {
					cl.form, _ = url.ParseQuery(string(body))
				}
				f.mu.Lock()
				before := f.before[method]
				f.mu.Unlock()
				if before != nil {
					before(cl)
				}
				f.mu.Lock()
				if method == "chat.postMessage" && f.limit429 > 0 {
					f.limit429--
					f.calls = append(f.calls, call{method: "429"})
					f.mu.Unlock()
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				f.seq++
				cl.ts = fmt.Sprintf("1800000000.%06d", f.seq)
				f.calls = append(f.calls, cl)
				out := answer(cl)
				f.mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(out)
			})
		}
	}
	f.srv = slacktest.NewTestServer(
		record("chat.postMessage", func(c call) any {
			return map[string]any{"ok": true, "channel": c.form.Get("channel"), "ts": c.ts}
		}),
		record("chat.update", func(c call) any {
			return map[string]any{"ok": true, "channel": c.form.Get("channel"), "ts": c.form.Get("ts")}
		}),
		record("chat.postEphemeral", func(c call) any { return map[string]any{"ok": true, "message_ts": c.ts} }),
		record("views.open", func(c call) any { return map[string]any{"ok": true, "view": map[string]any{"id": "V1"}} }),
		record("conversations.open", func(c call) any {
			return map[string]any{"ok": true, "channel": map[string]any{"id": "D" + c.form.Get("users")}}
		}),
		record("apps.connections.open", func(call) any { return map[string]any{"ok": true, "url": f.wsURL} }),
		record("conversations.info", func(c call) any {
			id := c.form.Get("channel")
			typ := f.convTypes[id]
			return map[string]any{"ok": true, "channel": map[string]any{
				"id": id, "is_im": typ == "im", "is_private": typ == "private", "is_channel": typ == "public"}}
		}),
	)
	f.srv.Start()
	t.Cleanup(f.srv.Stop)
	return f
}

// beforeAnswer runs hook on each call of method before the fake answers
// it (the caller waits meanwhile).
func (f *fakeSlack) beforeAnswer(method string, hook func(call)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before[method] = hook
}

// api is a Web API client of the fake server.
func (f *fakeSlack) api() *slack.Client {
	return slack.New("xoxb-test", slack.OptionAPIURL(f.srv.GetAPIURL()), slack.OptionAppLevelToken("xapp-test"))
}

// find returns the calls of method ("" for any) that match.
func (f *fakeSlack) find(method string, match func(call) bool) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if (method == "" || c.method == method) && (match == nil || match(c)) {
			out = append(out, c)
		}
	}
	return out
}

// await polls until method was called n times matching, and returns them.
func (f *fakeSlack) await(t *testing.T, n int, method string, match func(call) bool) []call {
	t.Helper()
	var got []call
	jstest.EventuallyState(t, jstest.Wait, fmt.Sprintf("fake slack: %d %s calls", n, method), func() (bool, string) {
		got = f.find(method, match)
		return len(got) >= n, fmt.Sprintf("%d matching; all calls: %v", len(got), f.dump())
	})
	return got
}

func (f *fakeSlack) methods() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		out = append(out, c.method+" "+c.form.Get("channel"))
	}
	return out
}

// in matches calls in channel.
func in(channel string) func(call) bool {
	return func(c call) bool { return c.form.Get("channel") == channel }
}

// buttonValue is the value of the button actionID in a posted prompt.
func buttonValue(t *testing.T, c call, actionID string) string {
	t.Helper()
	var blocks []map[string]any
	if err := json.Unmarshal([]byte(c.form.Get("blocks")), &blocks); err != nil {
		t.Fatalf("prompt blocks: %v", err)
	}
	for _, b := range blocks {
		els, _ := b["elements"].([]any)
		for _, e := range els {
			m, _ := e.(map[string]any)
			if m["action_id"] == actionID {
				return m["value"].(string)
			}
		}
	}
	t.Fatalf("prompt has no %s button: %s", actionID, c.form.Get("blocks"))
	return ""
}

// rig is a pipeline, the fake Slack and a running transport in HTTP mode.
type rig struct {
	// propose maps messages to calls (proposeCalls); off, text-only
	// messages go to the planner.
	propose bool
	h       *pipelinetest.H
	slack   *fakeSlack
	tr      *tgslack.Transport
	reg     *prometheus.Registry
	http    *httptest.Server
	stop    context.CancelFunc
	done    chan error
}

// testPolicy: write_file needs approval, and offers a session grant;
// echo too, and expires after a second (for the expiry rows).
const testPolicy = `{"version": "t", "default_approval": "required", "tools": {
  "echo": {"approval": "required", "expires_after": "1s"},
  "write_file": {"approval": "required", "grants": [{"option": "approve-session", "scope": "session", "for": "1h"}]}}}`

// proposeCalls maps test messages to calls: "write <path>", "echo <text>"
// and "hostile".
func proposeCalls(text string) []schemas.ProposedCall {
	verb, arg, _ := strings.Cut(text, " ")
	switch verb {
	case "write":
		return []schemas.ProposedCall{{Tool: "write_file", Args: fmt.Sprintf(`{"path": %q, "content": "from slack"}`, arg)}}
	case "echo":
		return []schemas.ProposedCall{{Tool: "echo", Args: fmt.Sprintf(`{"text": %q}`, arg)}}
	case "hostile": // a call that holds every reveal.HostileExamples text
		return []schemas.ProposedCall{{Tool: "write_file", Args: reveal.HostileArgs()}}
	}
	return nil
}

func startRig(t *testing.T) *rig {
	t.Helper()
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: testPolicy})
	r := &rig{propose: true, h: h, slack: newFakeSlack(t)}
	r.start(t)
	return r
}

// startPlannerRig is startRig with the planner stage asking model, and
// no mapping of messages to calls: a DM's text goes to the planner.
func startPlannerRig(t *testing.T, model *plannertest.Server) *rig {
	t.Helper()
	opts := planner.Options{Model: planner.ModelConfig{BaseURL: model.URL, Model: "scripted", Timeout: 10 * time.Second}}
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: testPolicy, Planner: &opts,
		Stages: append(slices.Clone(tollgate.AllStages()), tollgate.StagePlanner)})
	r := &rig{h: h, slack: newFakeSlack(t)}
	r.start(t)
	return r
}

// start (re)starts the transport on the rig's server and fake Slack.
func (r *rig) start(t *testing.T) {
	t.Helper()
	r.reg = prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := tgslack.Config{
		JS: r.h.JS, API: r.slack.api(), SigningSecret: secret, BotUserID: botUser,
		Logger: pipelinetest.Logger(), Registerer: r.reg,
	}
	if r.propose {
		cfg.ProposeCalls = proposeCalls
	}
	tr, err := tgslack.New(ctx, cfg)
	if err != nil {
		t.Fatalf("slack.New: %v", err)
	}
	r.tr = tr
	runCtx, stop := context.WithCancel(context.Background())
	r.stop, r.done = stop, make(chan error, 1)
	go func() { r.done <- tr.Run(runCtx) }()
	r.http = httptest.NewServer(tr.Handler())
	t.Cleanup(r.shutdown)
	jstest.EventuallyState(t, jstest.Wait, "transport ready", func() (bool, string) {
		err := tr.Ready()
		return err == nil, fmt.Sprint(err)
	})
}

func (r *rig) shutdown() {
	if r.stop == nil {
		return
	}
	r.http.Close()
	r.stop()
	<-r.done
	r.stop = nil
}

// send posts body to path signed at time at (with the given secret).
func (r *rig) send(t *testing.T, path, contentType string, body []byte, at time.Time, key string) *http.Response {
	t.Helper()
	return signedPost(t, r.http.URL+path, contentType, body, at, key)
}

// signedPost posts body to url signed at time at (with the given secret).
func signedPost(t *testing.T, url, contentType string, body []byte, at time.Time, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("X-Slack-Request-Timestamp", fmt.Sprint(at.Unix()))
	req.Header.Set("X-Slack-Signature", tgslack.Sign(key, at.Unix(), body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// eventBody is a signed Events API payload of a message event.
func eventBody(eventID string, ev map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"type": "event_callback", "team_id": team, "event_id": eventID, "event": ev})
	return b
}

// dm is a user's message in their DM with the app.
func dm(user, channel, ts, text string) map[string]any {
	return map[string]any{"type": "message", "channel_type": "im", "user": user, "channel": channel, "ts": ts, "text": text}
}

// clickBody is a signed block_actions payload (form-encoded).
func clickBody(user, channel, messageTS, actionID, value, actionTS string) []byte {
	p, _ := json.Marshal(map[string]any{
		"type": "block_actions", "team": map[string]any{"id": team}, "user": map[string]any{"id": user},
		"trigger_id": "trigger-" + actionTS,
		"container":  map[string]any{"type": "message", "channel_id": channel, "message_ts": messageTS},
		"actions":    []any{map[string]any{"action_id": actionID, "block_id": "tollgate_prompt", "value": value, "action_ts": actionTS, "type": "button"}},
	})
	return []byte(url.Values{"payload": {string(p)}}.Encode())
}

const form = "application/x-www-form-urlencoded"

func (r *rig) event(t *testing.T, eventID string, ev map[string]any) *http.Response {
	t.Helper()
	return r.send(t, "/slack/events", "application/json", eventBody(eventID, ev), time.Now(), secret)
}

func (r *rig) click(t *testing.T, body []byte) *http.Response {
	t.Helper()
	return r.send(t, "/slack/interactivity", form, body, time.Now(), secret)
}

// msgs is how many messages stream holds; for TOLLGATE_DECISIONS, how
// many decisions reached the approver (chattest.DecisionsSent: a decision
// the approver answers as a request is in no stream).
func (r *rig) msgs(t *testing.T, stream string) uint64 {
	if stream == topology.StreamDecisions {
		return chattest.DecisionsSent(t, r.h.JS)
	}
	return chattest.StreamMsgs(t, r.h.JS, stream)
}

// refused is tollgate_slack_refused_total{reason}.
func (r *rig) refused(t *testing.T, reason string) float64 {
	return chattest.Counter(t, r.reg, "tollgate_slack_refused_total", "reason", reason)
}

// approvalStatus reads an approval's status from KV.
func (r *rig) approvalStatus(t *testing.T, id string) schemas.ApprovalStatus {
	return r.h.For(t).Approval(id).Status
}

// awaitStatus polls an approval until it has status s.
func (r *rig) awaitStatus(t *testing.T, id string, s schemas.ApprovalStatus) {
	t.Helper()
	r.h.For(t).WaitApproval(id, string(s), func(a *schemas.ApprovalRecord) bool { return a.Status == s })
}

// turnOf is the turn id of a Slack message.
func turnOf(channel, ts string) string {
	return schemas.TurnID(tgslack.Name, team+":"+channel+":"+ts)
}

// promptOf is the posted prompt of approval id.
//
// It returns once the transport has also stored its record of the post
// (key "prompt.<approval id>" of tollgate_slack): Slack answers
// chat.postMessage before that write, and a click on a prompt the transport
// has no record of yet is refused (400), as it should be.
func (r *rig) promptOf(t *testing.T, id string) call {
	t.Helper()
	c := r.slack.await(t, 1, "chat.postMessage", func(c call) bool { return strings.Contains(c.form.Get("blocks"), id) })[0]
	chattest.Prompted(t, r.h.JS, tgslack.Name, id)
	return c
}

// replayAll publishes every stored event again (without message ids, as a
// redelivery beyond the dedupe window would store them).
func replayAll(t *testing.T, r *rig) {
	t.Helper()
	ctx, cancel := r.h.Ctx()
	defer cancel()
	cons, err := r.h.JS.OrderedConsumer(ctx, topology.StreamEvents, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	n := r.msgs(t, topology.StreamEvents)
	for i := uint64(0); i < n; i++ {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		if _, err := r.h.JS.Publish(ctx, m.Subject(), m.Data()); err != nil {
			t.Fatalf("replay: %v", err)
		}
	}
}

func (f *fakeSlack) dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, c := range f.calls {
		fmt.Fprintf(&b, "\n%s %v", c.method, c.form)
	}
	return b.String()
}

// awaitConsumed waits until the transport's consumer has handled every
// event stored so far.
func (r *rig) awaitConsumed(t *testing.T) { t.Helper(); chattest.Consumed(t, r.h.JS, tgslack.Name) }
