package discord_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat/chattest"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

const (
	botToken = "bot-test-token"
	appID    = "4000"
	guild    = "7000"
)

// call is one REST request the fake Discord received.
type call struct {
	method, path string
	auth         string
	body         map[string]any
	id           string // the message id the fake answered with (POST messages)
}

// content is the call's message content.
func (c call) content() string { s, _ := c.body["content"].(string); return s }

// channelOf is the channel of a /channels/{id}/messages call.
func (c call) channel() string {
	rest, _ := strings.CutPrefix(c.path, "/channels/")
	ch, _, _ := strings.Cut(rest, "/")
	return ch
}

// fakeDiscord is a REST server in the test: it records every call, gives
// each posted message a distinct id, opens DM channels "DM<user>", serves
// channels from chans, and can answer 429 with Retry-After.
type fakeDiscord struct {
	srv *httptest.Server

	mu       sync.Mutex
	calls    []call
	seq      int
	limit429 int                       // answer the next n message posts 429
	chans    map[string]map[string]any // GET /channels/{id}
	slowGet  time.Duration             // answer GET /channels/{id} only after this long
}

func newFakeDiscord(t *testing.T) *fakeDiscord {
	t.Helper()
	f := &fakeDiscord{chans: map[string]map[string]any{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeDiscord) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	slow := f.slowGet
	f.mu.Unlock()
	if r.Method == http.MethodGet {
		select {
		case <-time.After(slow):
		case <-r.Context().Done():
		}
	}
	c := call{method: r.Method, path: r.URL.Path, auth: r.Header.Get("Authorization")}
	_ = json.Unmarshal(raw, &c.body)
	f.mu.Lock()
	defer f.mu.Unlock()
	post := r.Method == http.MethodPost && strings.HasPrefix(c.path, "/channels/") && strings.HasSuffix(c.path, "/messages")
	if post && f.limit429 > 0 {
		f.limit429--
		f.calls = append(f.calls, call{method: "429", path: c.path})
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"message": "You are being rate limited.", "retry_after": 1, "global": false}`))
		return
	}
	var out any = map[string]any{}
	switch {
	case post:
		f.seq++
		c.id = fmt.Sprintf("9%05d", f.seq)
		out = map[string]any{"id": c.id, "channel_id": c.channel()}
	case r.Method == http.MethodPost && c.path == "/users/@me/channels":
		out = map[string]any{"id": "DM" + fmt.Sprint(c.body["recipient_id"]), "type": 1}
	case r.Method == http.MethodGet && strings.HasPrefix(c.path, "/channels/"):
		ch, ok := f.chans[c.channel()]
		if !ok {
			f.calls = append(f.calls, c)
			http.Error(w, `{"message": "Unknown Channel", "code": 10003}`, http.StatusNotFound)
			return
		}
		out = ch
	}
	f.calls = append(f.calls, c)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// find returns the calls of method ("" for any) whose path starts with prefix and that match.
func (f *fakeDiscord) find(method, prefix string, match func(call) bool) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if (method == "" || c.method == method) && strings.HasPrefix(c.path, prefix) && (match == nil || match(c)) {
			out = append(out, c)
		}
	}
	return out
}

// await polls until n calls match, and returns them.
func (f *fakeDiscord) await(t *testing.T, n int, method, prefix string, match func(call) bool) []call {
	t.Helper()
	var got []call
	jstest.EventuallyState(t, jstest.Wait, fmt.Sprintf("fake discord: %d %s %s calls", n, method, prefix), func() (bool, string) {
		got = f.find(method, prefix, match)
		return len(got) >= n, fmt.Sprintf("%d matching; all calls: %s", len(got), f.dump())
	})
	return got
}

func (f *fakeDiscord) dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, c := range f.calls {
		fmt.Fprintf(&b, "\n%s %s %v", c.method, c.path, c.body)
	}
	return b.String()
}

// customID is the custom_id of the button labelled label in a posted prompt.
func customID(t *testing.T, c call, label string) string {
	t.Helper()
	rows, _ := c.body["components"].([]any)
	for _, row := range rows {
		els, _ := row.(map[string]any)["components"].([]any)
		for _, e := range els {
			m, _ := e.(map[string]any)
			if m["label"] == label {
				return m["custom_id"].(string)
			}
		}
	}
	t.Fatalf("prompt has no %s button: %v", label, c.body)
	return ""
}

// rig is a pipeline, the fake Discord and a running transport.
type rig struct {
	h       *pipelinetest.H
	discord *fakeDiscord
	pub     ed25519.PublicKey
	key     ed25519.PrivateKey
	tr      *discord.Transport
	reg     *prometheus.Registry
	http    *httptest.Server
	stop    context.CancelFunc
	done    chan error
}

// testPolicy: write_file needs approval, and offers a grant for the
// requester's calls for an hour; echo too, and expires after a second
// (for the expiry rows).
const testPolicy = `{"version": "t", "default_approval": "required", "tools": {
  "echo": {"approval": "required", "expires_after": "1s"},
  "write_file": {"approval": "required", "grants": [{"option": "approve-day", "scope": "requester", "for": "1h"}]}}}`

// proposeCalls maps test requests to calls: "write <path>", "echo <text>"
// and "hostile".
func proposeCalls(text string) []schemas.ProposedCall {
	verb, arg, _ := strings.Cut(text, " ")
	switch verb {
	case "write":
		return []schemas.ProposedCall{{Tool: "write_file", Args: fmt.Sprintf(`{"path": %q, "content": "from discord"}`, arg)}}
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
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{h: h, discord: newFakeDiscord(t), pub: pub, key: key}
	r.start(t)
	return r
}

// start (re)starts the transport on the rig's server and fake Discord.
func (r *rig) start(t *testing.T) {
	t.Helper()
	r.reg = prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := discord.New(ctx, discord.Config{
		JS: r.h.JS, APIURL: r.discord.srv.URL, BotToken: botToken, PublicKey: r.pub,
		Logger: pipelinetest.Logger(), Registerer: r.reg, ProposeCalls: proposeCalls,
	})
	if err != nil {
		t.Fatalf("discord.New: %v", err)
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

// answer is the transport's answer to an interaction.
type answer struct {
	status int
	typ    int
	data   map[string]any
}

func (a answer) content() string { s, _ := a.data["content"].(string); return s }

// signedPost sends body to url signed with key at time at.
func signedPost(t *testing.T, url string, key ed25519.PrivateKey, body []byte, at time.Time) answer {
	t.Helper()
	ts := strconv.FormatInt(at.Unix(), 10)
	req, _ := http.NewRequest(http.MethodPost, url+"/discord/interactions", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Signature-Timestamp", ts)
	req.Header.Set("X-Signature-Ed25519", discord.Sign(key, ts, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST interaction: %v", err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode}
	if resp.StatusCode == http.StatusOK {
		var out struct {
			Type int            `json:"type"`
			Data map[string]any `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("interaction answer: %v", err)
		}
		a.typ, a.data = out.Type, out.Data
	}
	return a
}

// send posts a signed interaction now.
func (r *rig) send(t *testing.T, body []byte) answer {
	t.Helper()
	return signedPost(t, r.http.URL, r.key, body, time.Now())
}

// ids are distinct interaction ids (snowflakes).
var ids atomic.Int64

func nextID() string { return strconv.FormatInt(1300000000000000000+ids.Add(1), 10) }

// where is an interaction's place: a DM (guild "") or a guild channel of
// a Discord channel type.
type where struct {
	guild, channel string
	typ            int
}

func dmOf(user string) where { return where{channel: "DM" + user, typ: 1} }

// base is the common part of an interaction by user at w.
func base(id string, typ int, user string, w where) map[string]any {
	m := map[string]any{"id": id, "application_id": appID, "type": typ, "token": "tok-" + id, "version": 1,
		"channel_id": w.channel, "channel": map[string]any{"id": w.channel, "type": w.typ}}
	u := map[string]any{"id": user, "username": "u" + user}
	if w.guild != "" {
		m["guild_id"] = w.guild
		m["member"] = map[string]any{"user": u}
	} else {
		m["user"] = u
	}
	return m
}

// ask is an /ask <text> interaction; it returns the body and its id.
func ask(user string, w where, text string) ([]byte, string) {
	id := nextID()
	m := base(id, 2, user, w)
	m["data"] = map[string]any{"id": "1", "name": "ask", "type": 1, "options": []any{map[string]any{"name": "text", "type": 3, "value": text}}}
	b, _ := json.Marshal(m)
	return b, id
}

// click is a button click on message in channel.
func click(user string, w where, messageID, customID string) []byte {
	id := nextID()
	m := base(id, 3, user, w)
	m["data"] = map[string]any{"custom_id": customID, "component_type": 2}
	m["message"] = map[string]any{"id": messageID, "channel_id": w.channel}
	b, _ := json.Marshal(m)
	return b
}

// askOK sends /ask and returns the approval id of its first call.
func (r *rig) askOK(t *testing.T, user string, w where, text string) string {
	t.Helper()
	body, id := ask(user, w, text)
	if a := r.send(t, body); a.status != 200 || a.typ != 4 {
		t.Fatalf("/ask: status %d type %d", a.status, a.typ)
	}
	return schemas.ApprovalID(schemas.TurnID(discord.Name, id), 0)
}

// promptOf is the posted prompt of approval id.
func (r *rig) promptOf(t *testing.T, id string) call {
	t.Helper()
	c := r.discord.await(t, 1, http.MethodPost, "/channels/", func(c call) bool { return strings.Contains(c.content(), id) })[0]
	chattest.Prompted(t, r.h.JS, discord.Name, id)
	return c
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

// refused is tollgate_discord_refused_total{reason}.
func (r *rig) refused(t *testing.T, reason string) float64 {
	return chattest.Counter(t, r.reg, "tollgate_discord_refused_total", "reason", reason)
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

// awaitConsumed waits until the transport's consumer has handled every
// event stored so far.
func (r *rig) awaitConsumed(t *testing.T) { t.Helper(); chattest.Consumed(t, r.h.JS, discord.Name) }
