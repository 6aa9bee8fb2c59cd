package web_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/transport/gateway"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// testPolicy: web:alice decides every count call; web:bob only those of
// team (private-channel) turns; web:mallory none. quick calls expire
// after two seconds; web:alice and web:mallory decide them. vault calls
// are decided by web:id2 (the OIDC test's user) signed in with a second
// factor. pair calls need two of web:alice, web:bob and web:dave. files calls are decided like count calls and offer three grant
// options: this session, the folder of the path (any session of the
// requester) and a standing deny for the session.
const testPolicy = `{
  "version": "web-test-1",
  "default_approval": "required",
  "tools": {
    "count": {"approval": "required", "deciders": {"principals": ["web:alice", "web:bob"]},
              "audience_deciders": {"personal": {"principals": ["web:alice"]}}},
    "quick": {"approval": "required", "expires_after": "2s", "deciders": {"principals": ["web:alice", "web:mallory"]}},
    "vault": {"approval": "required", "deciders": {"principals": ["web:id2"], "min_assurance": "strong"}},
    "pair": {"approval": "required", "deciders": {"requester": false, "principals": ["web:alice", "web:bob", "web:dave"], "quorum": 2}},
    "files": {"approval": "required", "deciders": {"principals": ["web:alice", "web:bob"]},
              "audience_deciders": {"personal": {"principals": ["web:alice"]}}, "grants": [
      {"option": "approve-session", "scope": "session", "for": "1h"},
      {"option": "approve-folder", "scope": "requester", "for": "24h", "path_prefix": "path"},
      {"option": "deny-session", "scope": "session", "for": "1h"}
    ]}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	d  time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.d)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.d += d
	c.mu.Unlock()
}

// inbox is a running pipeline with the gateway serving the web inbox (dev
// sign-in on) on a loopback port.
type inbox struct {
	*pipelinetest.H
	t     *testing.T
	url   string
	srv   *httptest.Server // the gateway process url names, first
	clock *clock
	count *pipelinetest.Counter
	files *pipelinetest.Counter
}

// startInbox starts the pipeline (every stage, testPolicy, the count and
// quick tools) and the gateway with the inbox mounted; cfg adjusts the
// inbox's Config.
func startInbox(t *testing.T, cfg func(*web.Config)) *inbox {
	t.Helper()
	count, files := &pipelinetest.Counter{}, &pipelinetest.Counter{ToolName: "files"}
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: testPolicy, Tools: []tools.Tool{count, &pipelinetest.Counter{ToolName: "quick"}, &pipelinetest.Counter{ToolName: "vault"}, &pipelinetest.Counter{ToolName: "pair"}, files}})
	c := &clock{}
	srv := startGateway(t, h, c, cfg)
	return &inbox{H: h, t: t, url: srv.URL, srv: srv, clock: c, count: count, files: files}
}

// stopGateway stops the first gateway process, cutting its open
// connections (a live stream included), as a restart does.
func (in *inbox) stopGateway() {
	in.srv.CloseClientConnections()
	in.srv.Close()
}

// startGateway starts one gateway process's worth (a web.Server and the
// gateway mounting it, on a loopback port) on h's pipeline; several are
// replicas of one another, sharing only NATS.
func startGateway(t *testing.T, h *pipelinetest.H, c *clock, cfg func(*web.Config)) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	wc := web.Config{JS: h.JS, Policy: h.Policy, Keys: h.Keys, Logger: pipelinetest.Logger(), Addr: srv.Listener.Addr().String(), DevSignIn: true,
		DecisionRate: 50, DecisionBurst: 50, VisitorRate: rate.Inf, Heartbeat: 200 * time.Millisecond, Now: c.now}
	if cfg != nil {
		cfg(&wc)
	}
	w, err := web.New(wc)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{JS: h.JS, Policy: h.Policy, Logger: pipelinetest.Logger(), Web: w})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = gw.Handler()
	srv.Start()
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return srv
}

// browser is one user agent: a cookie jar and what it last saw.
type browser struct {
	in  *inbox
	c   *http.Client
	jar *cookiejar.Jar

	mu   sync.Mutex
	csrf string // the CSRF token of the last page
}

// token is the CSRF token of the last page.
func (b *browser) token() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.csrf
}

func (in *inbox) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{in: in, jar: jar, c: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// do sends a request and returns the response and its body; a page's
// CSRF token is remembered.
func (b *browser) do(method, path string, form url.Values, hdr ...string) (*http.Response, string) {
	b.in.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.in.url+path, body)
	if err != nil {
		b.in.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.in.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if m := csrfField.FindSubmatch(out); m != nil {
		b.mu.Lock()
		b.csrf = string(m[1])
		b.mu.Unlock()
	}
	return resp, string(out)
}

// signIn signs in with the dev form as subject and returns the inbox page.
func (b *browser) signIn(subject string) string {
	b.in.t.Helper()
	b.do("GET", "/signin", nil)
	resp, page := b.do("POST", "/signin/dev", url.Values{"csrf": {b.token()}, "subject": {subject}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "web:"+subject) {
		b.in.t.Fatalf("sign in as %s: %d\n%s", subject, resp.StatusCode, page)
	}
	return page
}

// decide posts option on approval id with digest, as inbox.js does
// (the answer is the card alone).
func (b *browser) decide(id, option, digest string) (*http.Response, string) {
	b.in.t.Helper()
	return b.do("POST", "/approvals/"+id+"/decision", url.Values{"csrf": {b.token()}, "option": {option}, "digest": {digest}, "note": {"from the test"}}, "Tollgate-Fragment", "card")
}

// request sends a turn of sender (a DM, or a private channel when team)
// with one call of tool and returns its pending approval.
func (in *inbox) request(sender, tool, args string, team bool) *schemas.ApprovalRecord {
	in.t.Helper()
	return in.WaitPending(schemas.ApprovalID(in.send(in.NextID("s"), sender, tool, args, team), 0))
}

// send sends a turn of sender in session (a DM, or a private channel when
// team) with one call of tool and returns the turn id.
func (in *inbox) send(session, sender, tool, args string, team bool) string {
	in.t.Helper()
	m := in.Inbound(session, sender, pipelinetest.Call(tool, args))
	if team {
		m.Channel = schemas.Channel{ID: "team-room", Kind: schemas.ChannelPrivate}
	}
	return in.Send(m)
}

// webDecisions is how many decisions the inbox sent on approval id, as
// the web transport (pt.H.SentDecisions).
func (in *inbox) webDecisions(id string) int {
	return len(in.SentDecisions(web.Transport, id))
}

// card is approval id's card as its own page shows it to b (from its
// <article> to its end), and the page's status.
func (b *browser) card(id string) (int, string) {
	b.in.t.Helper()
	resp, page := b.do("GET", "/approvals/"+id, nil)
	start := strings.Index(page, `<article class="card`)
	if start < 0 {
		return resp.StatusCode, ""
	}
	card, _, _ := strings.Cut(page[start:], "</article>")
	return resp.StatusCode, card + "</article>"
}
