package web_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// sessionWrites is the sessions bucket's stream state: its messages and
// the sequence of its last write.
func (in *inbox) sessionWrites() (msgs, last uint64) {
	in.t.Helper()
	s, err := in.JS.Stream(context.Background(), "KV_"+topology.BucketWebSessions)
	if err != nil {
		in.t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		in.t.Fatal(err)
	}
	return info.State.Msgs, info.State.LastSeq
}

// from makes b's connections come from the loopback address ip.
func (b *browser) from(ip string) *browser {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 10 * time.Second}
	b.c.Transport = &http.Transport{DialContext: d.DialContext}
	return b
}

// TestAnonymousVisitsWriteNothing: 10,000 requests of visitors who have
// not signed in (the inbox, the sign-in page, an approval's page, the
// session check, an OIDC sign-in started, with no cookie, a forged
// session cookie or a forged sign-in cookie) write nothing to the
// sessions bucket; the one sign-in that follows writes its one session.
func TestAnonymousVisitsWriteNothing(t *testing.T) {
	in, p := startOIDCInbox(t)
	p.set([]string{"mfa"}, "")
	a := in.request("carol", "count", `{"n":1}`, true)
	msgs0, last0 := in.sessionWrites()
	paths := []string{"/", "/signin", "/approvals/" + a.ApprovalID, "/session", "/signin/oidc", "/history", "/grants"}
	cookies := []*http.Cookie{nil, {Name: "tollgate_session", Value: "forged-session-id"}, {Name: "tollgate_signin", Value: "e30.k1.AAAA"}}
	const total = 10000
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			for i := range work {
				req, _ := http.NewRequest("GET", in.url+paths[i%len(paths)], nil)
				if ck := cookies[i/len(paths)%len(cookies)]; ck != nil {
					req.AddCookie(ck)
				}
				resp, err := c.Do(req)
				if err != nil {
					errs <- err
					return
				}
				resp.Body.Close()
				if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
					errs <- fmt.Errorf("GET %s: %d", req.URL.Path, resp.StatusCode)
					return
				}
			}
		}()
	}
	for i := range total {
		select {
		case work <- i:
		case err := <-errs:
			close(work)
			t.Fatal(err)
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if msgs, last := in.sessionWrites(); msgs != msgs0 || last != last0 {
		t.Fatalf("%d anonymous requests wrote to the sessions bucket: %d messages (was %d), last sequence %d (was %d)", total, msgs, msgs0, last, last0)
	}
	// The later fact: a sign-in is one write.
	b := in.browser()
	if resp, page := b.do("GET", "/signin/oidc", nil); resp.StatusCode != http.StatusOK || !strings.Contains(page, "web:id2") {
		t.Fatalf("sign-in: %d\n%s", resp.StatusCode, page)
	}
	if msgs, last := in.sessionWrites(); msgs != msgs0+1 || last != last0+1 {
		t.Fatalf("a sign-in wrote %d messages (last sequence %d, was %d), want 1", msgs-msgs0, last, last0)
	}
}

// TestVisitorsAreRateLimitedPerAddress: a client that has not signed in
// is refused 429 RATE_LIMITED (with Retry-After) past its burst; a
// client at another address is not, nor is a person who has signed in,
// nor are static files.
func TestVisitorsAreRateLimitedPerAddress(t *testing.T) {
	in := startInbox(t, func(c *web.Config) { c.VisitorRate, c.VisitorBurst = 0.001, 4 })
	person := in.browser().from("127.0.0.3")
	person.signIn("alice") // two requests as a visitor, then signed in
	for range 6 {
		if resp, _ := person.do("GET", "/", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("a signed-in person: %d", resp.StatusCode)
		}
	}
	visitor := in.browser().from("127.0.0.2")
	for i := range 4 {
		if resp, _ := visitor.do("GET", "/signin", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("visit %d within the burst: %d", i+1, resp.StatusCode)
		}
	}
	for _, path := range []string{"/signin", "/", "/approvals/a-x-0"} {
		resp, body := visitor.do("GET", path, nil)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Tollgate-Code") != string(web.CodeRateLimited) ||
			resp.Header.Get("Retry-After") == "" || !strings.Contains(body, string(web.CodeRateLimited)) {
			t.Fatalf("GET %s past the burst: %d %v %q", path, resp.StatusCode, resp.Header, body)
		}
	}
	if resp, _ := visitor.do("GET", "/static/inbox.js", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("a static file past the burst: %d", resp.StatusCode)
	}
	other := in.browser().from("127.0.0.4")
	if resp, _ := other.do("GET", "/signin", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("another address: %d", resp.StatusCode)
	}
}

// signinCookie is b's sign-in cookie.
func (b *browser) signinCookie() *http.Cookie {
	u, _ := url.Parse(b.in.url)
	for _, c := range b.jar.Cookies(u) {
		if c.Name == "tollgate_signin" {
			return c
		}
	}
	return nil
}

// TestSignInCookieCannotBeForged: the sign-in form's token is in a
// signed cookie: one edited, one tagged with a key the inbox does not
// hold, and one past its half hour do not sign anyone in (403
// CSRF_INVALID); the same cookie as issued does.
func TestSignInCookieCannotBeForged(t *testing.T) {
	in := startInbox(t, nil)
	edit := func(c *http.Cookie) *http.Cookie {
		body, rest, _ := strings.Cut(c.Value, ".")
		raw, _ := base64.RawURLEncoding.DecodeString(body)
		var st map[string]any
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatalf("sign-in cookie %q: %v", c.Value, err)
		}
		st["c"] = "chosen-by-the-attacker"
		raw, _ = json.Marshal(st)
		return &http.Cookie{Name: c.Name, Value: base64.RawURLEncoding.EncodeToString(raw) + "." + rest}
	}
	for _, tc := range []struct {
		name  string
		tweak func(b *browser) string // returns the csrf to post
	}{
		{"an edited cookie", func(b *browser) string {
			c := edit(b.signinCookie())
			u, _ := url.Parse(b.in.url)
			b.jar.SetCookies(u, []*http.Cookie{c})
			return "chosen-by-the-attacker"
		}},
		{"another key's tag", func(b *browser) string {
			c := b.signinCookie()
			body, rest, _ := strings.Cut(c.Value, ".")
			_, tag, _ := strings.Cut(rest, ".")
			u, _ := url.Parse(b.in.url)
			b.jar.SetCookies(u, []*http.Cookie{{Name: c.Name, Value: body + ".other." + tag}})
			return b.token()
		}},
		{"a cookie past its time", func(b *browser) string {
			in.clock.advance(31 * time.Minute)
			return b.token()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := in.browser()
			b.do("GET", "/signin", nil)
			if b.signinCookie() == nil || b.token() == "" {
				t.Fatal("the sign-in page set no sign-in cookie or form token")
			}
			csrf := tc.tweak(b)
			resp, page := b.do("POST", "/signin/dev", url.Values{"csrf": {csrf}, "subject": {"mallory"}})
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, string(web.CodeCSRFInvalid)) || strings.Contains(page, "web:mallory") {
				t.Fatalf("%d\n%s", resp.StatusCode, page)
			}
		})
	}
	t.Run("the cookie as issued", func(t *testing.T) {
		b := in.browser()
		b.signIn("alice")
	})
}

// TestOnlyAPostSignsOut: a signed-in person stays signed in through a
// GET of /signin/oidc (a new sign-in started, then abandoned), a GET of
// /signout and a POST of /signout without the session's CSRF token; the
// POST with it signs them out.
func TestOnlyAPostSignsOut(t *testing.T) {
	in, p := startOIDCInbox(t)
	p.set([]string{"mfa"}, "")
	b := in.browser()
	if resp, page := b.do("GET", "/signin/oidc", nil); resp.StatusCode != http.StatusOK || !strings.Contains(page, "web:id2") {
		t.Fatalf("sign-in: %d\n%s", resp.StatusCode, page)
	}
	live := func() int {
		resp, _ := b.do("GET", "/session", nil)
		return resp.StatusCode
	}
	b.c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if resp, _ := b.do("GET", "/signin/oidc", nil); resp.StatusCode != http.StatusFound {
		t.Fatalf("GET /signin/oidc: %d, want 302 to the provider", resp.StatusCode)
	}
	if code := live(); code != http.StatusNoContent {
		t.Fatalf("after GET /signin/oidc: /session %d, want 204 (still signed in)", code)
	}
	b.c.CheckRedirect = nil
	b.do("GET", "/", nil) // the page's token
	if resp, _ := b.do("GET", "/signout", nil); resp.StatusCode == http.StatusOK || live() != http.StatusNoContent {
		t.Fatalf("GET /signout: %d, /session %d; want a refusal and still signed in", resp.StatusCode, live())
	}
	if resp, page := b.do("POST", "/signout", url.Values{"csrf": {"not-the-token"}}); resp.StatusCode != http.StatusForbidden || !strings.Contains(page, string(web.CodeCSRFInvalid)) || live() != http.StatusNoContent {
		t.Fatalf("POST /signout with a wrong token: %d, /session %d", resp.StatusCode, live())
	}
	b.do("GET", "/", nil)
	if resp, _ := b.do("POST", "/signout", url.Values{"csrf": {b.token()}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /signout: %d", resp.StatusCode)
	}
	if code := live(); code != http.StatusUnauthorized {
		t.Fatalf("after POST /signout: /session %d, want 401", code)
	}
}
