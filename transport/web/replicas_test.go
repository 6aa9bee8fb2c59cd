package web_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/tollgate-dev/tollgate/schemas"
)

// balancer is a load balancer without stickiness in front of gateway
// processes: pages and form posts go to each backend in turn, and so,
// separately, do the rest (static files, live streams). It records what
// each backend answered.
type balancer struct {
	srv *httptest.Server

	mu       sync.Mutex
	backends []*httputil.ReverseProxy
	names    []string
	next     [2]int
	served   map[string][]string // backend -> "METHOD path status"
}

func newBalancer(t *testing.T) *balancer {
	b := &balancer{served: map[string][]string{}}
	b.srv = httptest.NewServer(b)
	t.Cleanup(func() { b.srv.CloseClientConnections(); b.srv.Close() })
	return b
}

// set makes srvs (named) the backends.
func (b *balancer) set(names []string, srvs ...*httptest.Server) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backends, b.names = nil, names
	for _, s := range srvs {
		u, _ := url.Parse(s.URL)
		p := httputil.NewSingleHostReverseProxy(u)
		p.FlushInterval = -1 // live streams pass through at once
		b.backends = append(b.backends, p)
	}
}

// statusWriter keeps the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(s int) { w.status = s; w.ResponseWriter.WriteHeader(s) }
func (w *statusWriter) Flush()            { w.ResponseWriter.(http.Flusher).Flush() }

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind := 0
	if strings.HasPrefix(r.URL.Path, "/static/") || r.URL.Path == "/events" || r.URL.Path == "/session" || r.URL.Path == "/favicon.ico" {
		kind = 1
	}
	b.mu.Lock()
	i := b.next[kind] % len(b.backends)
	b.next[kind]++
	p, name := b.backends[i], b.names[i]
	b.mu.Unlock()
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	p.ServeHTTP(sw, r)
	if kind == 0 {
		b.mu.Lock()
		b.served[name] = append(b.served[name], r.Method+" "+r.URL.Path+" "+http.StatusText(sw.status))
		b.mu.Unlock()
	}
}

func (b *balancer) log(name string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.served[name]...)
}

// TestTwoGatewaysServeOneBrowserWithoutStickiness: two gateway processes
// behind a balancer that sends pages and posts to each in turn serve one
// browser: it signs in (the form from one, the post to the other), each
// reload is signed in whichever answers, each lists the prompts (from its
// own pending index) and two decisions (one on each) apply. With sessions in one process's memory
// the sign-in post fails on the other process (its CSRF token unknown).
func TestTwoGatewaysServeOneBrowserWithoutStickiness(t *testing.T) {
	exe := chromiumPath(t)
	in := startInbox(t, nil)
	second := startGateway(t, in.H, in.clock, nil)
	lb := newBalancer(t)
	lb.set([]string{"A", "B"}, in.srv, second)
	in.url = lb.srv.URL

	alice := headless(t, exe)
	in.signInAs(t, alice, "alice")
	for range 3 {
		do(t, alice, "a reload is signed in, whichever gateway answers",
			chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("principal")), until(`document.body.dataset.connected === "1"`))
	}
	a := in.request("carol", "count", `{"n":1}`, true)
	b := in.request("carol", "count", `{"n":2}`, true)
	for range 2 {
		do(t, alice, "each gateway lists both from its own pending index",
			chromedp.Reload(), chromedp.WaitReady(chromedp.CSS(rowSel(a.ApprovalID))), chromedp.WaitReady(chromedp.CSS(rowSel(b.ApprovalID))),
			until(`document.body.dataset.connected === "1"`))
	}
	// Both cards opened first (one fetch each, alternating), so that the
	// two decisions go one to each gateway.
	do(t, alice, "open both cards", opened(a.ApprovalID), opened(b.ApprovalID))
	for _, d := range []struct {
		rec    *schemas.ApprovalRecord
		option string
		want   schemas.ApprovalStatus
	}{{a, "approve", schemas.ApprovalApproved}, {b, "deny", schemas.ApprovalDenied}} {
		sel := cardSel(d.rec.ApprovalID)
		do(t, alice, "the prompt is listed and is decided",
			chromedp.WaitVisible(chromedp.CSS(sel+` button[value=`+d.option+`]`)),
			chromedp.Click(chromedp.CSS(sel+` button[value=`+d.option+`]`)),
			chromedp.WaitVisible(chromedp.CSS(sel+` .verdict-applied`)))
		if got := in.Approval(d.rec.ApprovalID); got.Status != d.want || got.Decision.Principal != "web:alice" {
			t.Fatalf("approval %s by %+v, want %s by web:alice", got.Status, got.Decision, d.want)
		}
	}
	for _, name := range []string{"A", "B"} {
		log := lb.log(name)
		var pages, posts int
		for _, l := range log {
			if strings.HasPrefix(l, "GET / ") {
				pages++
			}
			if strings.HasPrefix(l, "POST ") {
				posts++
			}
			if !strings.HasSuffix(l, " OK") && !strings.HasSuffix(l, " See Other") {
				t.Errorf("gateway %s answered %s", name, l)
			}
		}
		if pages == 0 || posts == 0 {
			t.Errorf("gateway %s served %d inbox pages and %d posts, want some of each: %v", name, pages, posts, log)
		}
	}
}

// TestRestartKeepsTheOpenPageSignedIn: the gateway process serving an
// open, signed-in page stops and a new one takes its place. The page's
// live stream reconnects to the new process, still signed in: a new
// prompt appears and is decided. Then the person signs out everywhere
// from another browser: the open page says at once that the session has
// ended, disables its buttons and offers to sign in again.
func TestRestartKeepsTheOpenPageSignedIn(t *testing.T) {
	exe := chromiumPath(t)
	in := startInbox(t, nil)
	lb := newBalancer(t)
	lb.set([]string{"old"}, in.srv)
	in.url = lb.srv.URL

	alice := headless(t, exe)
	in.signInAs(t, alice, "alice")
	before := in.request("carol", "count", `{"n":1}`, true)
	do(t, alice, "a prompt arrives", opened(before.ApprovalID), chromedp.WaitVisible(chromedp.CSS(cardSel(before.ApprovalID))))

	// The restart: the old process goes, a new one (knowing nothing of
	// the old one's memory) answers from now on.
	in.stopGateway()
	fresh := startGateway(t, in.H, in.clock, nil)
	lb.set([]string{"new"}, fresh)

	after := in.request("carol", "count", `{"n":2}`, true)
	sel := cardSel(after.ApprovalID)
	do(t, alice, "after the restart the open page gets the new prompt and decides it",
		opened(after.ApprovalID),
		chromedp.WaitVisible(chromedp.CSS(sel+` button[value=approve]`)),
		chromedp.Click(chromedp.CSS(sel+` button[value=approve]`)),
		chromedp.WaitVisible(chromedp.CSS(sel+` .verdict-applied`)),
		until(`document.getElementById("signed-out").hidden`))
	if got := in.Approval(after.ApprovalID); got.Status != schemas.ApprovalApproved {
		t.Fatalf("approval %s", got.Status)
	}

	// Signing out everywhere, from another browser, ends this one's
	// session too.
	open := in.request("carol", "count", `{"n":3}`, true)
	do(t, alice, "a third prompt", opened(open.ApprovalID), chromedp.WaitVisible(chromedp.CSS(cardSel(open.ApprovalID)+` button[value=approve]`)))
	other := in.browser()
	other.signIn("alice")
	if resp, body := other.do("POST", "/signout", url.Values{"csrf": {other.token()}, "everywhere": {"1"}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("sign out everywhere: %d\n%s", resp.StatusCode, body)
	}
	do(t, alice, "the open page says the session ended, disables its buttons and offers to sign in",
		chromedp.WaitVisible(chromedp.ID("signed-out")),
		chromedp.WaitVisible(chromedp.ID("signin-again")),
		until(`document.querySelector(`+jsString(cardSel(open.ApprovalID)+` fieldset`)+`).disabled`))
	if rec := in.Approval(open.ApprovalID); rec.Status != schemas.ApprovalPending {
		t.Fatalf("approval %s", rec.Status)
	}
}
