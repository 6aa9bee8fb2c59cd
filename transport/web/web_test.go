package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// TestDevSignInIsRefusedOffLoopback: New refuses dev sign-in on any
// address that is not a loopback one, and the form answers only requests
// that came over loopback.
func TestDevSignInIsRefusedOffLoopback(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{Stages: []string{}})
	cfg := web.Config{JS: h.JS, Policy: h.Policy, Keys: h.Keys, Logger: pipelinetest.Logger(), DevSignIn: true}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8080", true},
		{"[::1]:8080", true},
		{"localhost:8080", true},
		{"0.0.0.0:8080", false},
		{":8080", false},
		{"[::]:8080", false},
		{"192.0.2.10:8080", false},
		{"inbox.example.com:443", false},
		{"", false},
	} {
		t.Run("address "+tc.addr, func(t *testing.T) {
			c := cfg
			c.Addr = tc.addr
			_, err := web.New(c)
			if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, web.ErrDevSignInNotLoopback)) {
				t.Fatalf("New with dev sign-in on %q: %v", tc.addr, err)
			}
		})
	}
	t.Run("without dev sign-in any address is fine and the form is off", func(t *testing.T) {
		c := cfg
		c.Addr, c.DevSignIn = "0.0.0.0:8080", false
		s, err := web.New(c)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s)
		defer srv.Close()
		resp, err := http.PostForm(srv.URL+"/signin/dev", url.Values{"subject": {"alice"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("dev sign-in with it off: %d", resp.StatusCode)
		}
	})
	t.Run("a request from another host is refused", func(t *testing.T) {
		c := cfg
		c.Addr = "127.0.0.1:8080"
		s, err := web.New(c)
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("POST", "/signin/dev", strings.NewReader("subject=alice"))
		req.RemoteAddr, req.Host = "192.0.2.7:5555", "127.0.0.1:8080"
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, fakeAddr("127.0.0.1:8080")))
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != http.StatusNotFound || rec.Header().Get("Set-Cookie") != "" {
			t.Fatalf("dev sign-in from 192.0.2.7: %d, cookie %q", rec.Code, rec.Header().Get("Set-Cookie"))
		}
	})
}

type fakeAddr string

func (a fakeAddr) Network() string { return "tcp" }
func (a fakeAddr) String() string  { return string(a) }

// TestInboxListsWhatThePrincipalMayDecide: the inbox lists a pending
// approval, with everything a decider needs, exactly to the people the
// approver's decider rule accepts; a personal turn's only to its deciders;
// nothing to a visitor who is not signed in.
func TestInboxListsWhatThePrincipalMayDecide(t *testing.T) {
	in := startInbox(t, nil)
	personal := in.request("carol", "count", `{"path":"notes/a.txt","content":"`+strings.Repeat("x", 400)+`"}`, false)
	team := in.request("carol", "count", `{"n":1}`, true)

	for _, tc := range []struct {
		who  string
		want []*schemas.ApprovalRecord
		not  []*schemas.ApprovalRecord
	}{
		{"alice", []*schemas.ApprovalRecord{personal, team}, nil},
		{"bob", []*schemas.ApprovalRecord{team}, []*schemas.ApprovalRecord{personal}},
		{"mallory", nil, []*schemas.ApprovalRecord{personal, team}},
		{"", nil, []*schemas.ApprovalRecord{personal, team}},
	} {
		t.Run("as "+cmpOr(tc.who, "a visitor who is not signed in"), func(t *testing.T) {
			b := in.browser()
			var page string
			if tc.who == "" {
				_, page = b.do("GET", "/", nil)
			} else {
				page = b.signIn(tc.who)
			}
			for _, a := range tc.want {
				if !strings.Contains(page, `id="row-`+a.ApprovalID+`"`) {
					t.Errorf("%s is not listed", a.ApprovalID)
				}
				if status, card := b.card(a.ApprovalID); status != http.StatusOK || !strings.Contains(card, a.ArgsDigest) {
					t.Errorf("%s: its card page answers %d", a.ApprovalID, status)
				}
			}
			for _, a := range tc.not {
				if strings.Contains(page, a.ApprovalID) || strings.Contains(page, a.ArgsDigest) {
					t.Errorf("%s is shown", a.ApprovalID)
				}
				if status, card := b.card(a.ApprovalID); status != http.StatusNotFound || card != "" {
					t.Errorf("%s: its card page answers %d with a card to a person who may not decide it", a.ApprovalID, status)
				}
			}
			if len(tc.want) == 0 && tc.who != "" && !strings.Contains(page, `id="empty" class="empty">`) {
				t.Errorf("the page does not say that nothing waits")
			}
		})
	}
	t.Run("a card shows the call, who asked, where, the options and the time left", func(t *testing.T) {
		b := in.browser()
		b.signIn("alice")
		_, c1 := b.card(personal.ApprovalID)
		_, c2 := b.card(team.ApprovalID)
		page := c1 + c2
		for _, want := range []string{
			personal.ArgsDigest, "<code>count</code>", "cli:carol", "via cli", "dm-carol", "audience personal", "team-room", "audience team",
			`name="option" value="approve"`, `name="option" value="deny"`, `data-left="` + personal.ExpiresAt.UTC().Format(time.RFC3339) + `"`,
			"&#34;notes/a.txt&#34;", "<details><summary>", strings.Repeat("x", 400), // the long value folded, and there in full
		} {
			if !strings.Contains(page, want) {
				t.Errorf("the inbox lacks %q", want)
			}
		}
	})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestArgumentsAreEscaped: markup in a call's arguments is shown as text.
func TestArgumentsAreEscaped(t *testing.T) {
	in := startInbox(t, nil)
	a := in.request("carol", "count", `{"x":"<script>alert(1)</script>"}`, false)
	b := in.browser()
	list := b.signIn("alice")
	_, card := b.card(a.ApprovalID)
	for _, page := range []string{list, card} {
		if !strings.Contains(page, a.ApprovalID) || strings.Contains(page, "<script>alert") || !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Fatalf("the arguments are not escaped:\n%s", page)
		}
	}
}

// TestSecurityHeadersAndCookie: every page forbids inline script and
// framing; the session cookie is HttpOnly and SameSite, and Secure under
// TLS.
func TestSecurityHeadersAndCookie(t *testing.T) {
	in := startInbox(t, nil)
	resp, _ := in.browser().do("GET", "/", nil)
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") ||
		resp.Header.Get("X-Frame-Options") != "DENY" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("headers %v", resp.Header)
	}
	c := resp.Cookies()
	if len(c) != 1 || !c[0].HttpOnly || c[0].SameSite != http.SameSiteLaxMode || c[0].Secure {
		t.Fatalf("cookie over plain HTTP: %+v", c)
	}

	w, err := web.New(web.Config{JS: in.JS, Policy: in.Policy, Keys: in.Keys, Logger: pipelinetest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	tls := httptest.NewTLSServer(w)
	defer tls.Close()
	r2, err := tls.Client().Get(tls.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if c := r2.Cookies(); len(c) != 1 || !c[0].Secure || !c[0].HttpOnly {
		t.Fatalf("cookie over TLS: %+v", c)
	}
	if r2.Header.Get("Strict-Transport-Security") == "" {
		t.Fatal("no HSTS over TLS")
	}
	resp, body := in.browser().do("GET", "/v1/openapi.json", nil)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || !strings.Contains(body, "openapi") {
		t.Fatalf("the API is not the gateway's any more: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// TestApproveAppliesOnceAndShowsTheVerdict: an approve from the inbox is
// applied by the approver as web:alice, published on the web transport's
// decision subject; the page shows the verdict; a double click and a
// resubmit are the same one decision; the call runs once.
func TestApproveAppliesOnceAndShowsTheVerdict(t *testing.T) {
	in := startInbox(t, nil)
	a := in.request("carol", "count", `{"n":1}`, false)
	b := in.browser()
	b.signIn("alice")

	var wg sync.WaitGroup
	codes := make([]int, 2)
	verdicts := make([]string, 2)
	for i := range 2 { // a double click
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := b.decide(a.ApprovalID, "approve", a.ArgsDigest)
			codes[i], verdicts[i] = resp.StatusCode, resp.Header.Get("Tollgate-Verdict")
		}()
	}
	wg.Wait()
	for i := range 2 {
		if codes[i] != http.StatusOK || verdicts[i] != web.VerdictApplied {
			t.Fatalf("click %d: %d %q, want 200 applied", i+1, codes[i], verdicts[i])
		}
	}
	resp, card := b.decide(a.ApprovalID, "approve", a.ArgsDigest) // a resubmit
	if resp.StatusCode != http.StatusOK || !strings.Contains(card, "Your approve was applied") || !strings.Contains(card, "approved by web:alice") {
		t.Fatalf("resubmit: %d\n%s", resp.StatusCode, card)
	}
	rec := in.Approval(a.ApprovalID)
	if rec.Status != schemas.ApprovalApproved || rec.Decision.Principal != "web:alice" {
		t.Fatalf("approval %s by %+v", rec.Status, rec.Decision)
	}
	if n := in.webDecisions(a.ApprovalID); n != 1 {
		t.Fatalf("%d decisions stored on the web subject, want 1", n)
	}
	out := in.WaitOutcome(a.TurnID)
	if out.State != schemas.TurnCompleted || in.count.Runs(a.CallID) != 1 {
		t.Fatalf("outcome %s, runs %d", out.State, in.count.Runs(a.CallID))
	}
	t.Run("a deny after it is rejected by the approver, with its code", func(t *testing.T) {
		resp, card := b.decide(a.ApprovalID, "deny", a.ArgsDigest)
		if resp.StatusCode != http.StatusConflict || resp.Header.Get("Tollgate-Code") != string(schemas.CodeApprovalAlreadyDecided) || !strings.Contains(card, "APPROVAL_ALREADY_DECIDED") {
			t.Fatalf("deny after approve: %d %s\n%s", resp.StatusCode, resp.Header.Get("Tollgate-Code"), card)
		}
	})
	t.Run("without script the answer is a page", func(t *testing.T) {
		resp, page := b.do("POST", "/approvals/"+a.ApprovalID+"/decision", url.Values{"csrf": {b.csrf}, "option": {"approve"}, "digest": {a.ArgsDigest}})
		if resp.StatusCode != http.StatusOK || !strings.Contains(page, "<!doctype html>") || !strings.Contains(page, "Your approve was applied") {
			t.Fatalf("%d\n%s", resp.StatusCode, page)
		}
	})
}

// TestRefusedDecisionsPublishNothing: a decision the inbox refuses is
// answered with its code, and nothing reaches the bus; the approval stays
// pending.
func TestRefusedDecisionsPublishNothing(t *testing.T) {
	in := startInbox(t, func(c *web.Config) { c.SessionTTL = time.Hour })
	x := in.request("carol", "count", `{"n":1}`, false)
	y := in.request("carol", "count", `{"n":2}`, false)

	for _, tc := range []struct {
		name   string
		setup  func(b *browser) (id, digest string)
		status int
		code   schemas.Code
	}{
		{"a forged CSRF token", func(b *browser) (string, string) {
			b.csrf = strings.Repeat("A", len(b.csrf))
			return x.ApprovalID, x.ArgsDigest
		}, http.StatusForbidden, web.CodeCSRFInvalid},
		{"another session's CSRF token", func(b *browser) (string, string) {
			other := in.browser()
			other.signIn("alice")
			b.csrf = other.csrf
			return x.ApprovalID, x.ArgsDigest
		}, http.StatusForbidden, web.CodeCSRFInvalid},
		{"approval X with Y's digest", func(b *browser) (string, string) { return x.ApprovalID, y.ArgsDigest }, http.StatusConflict, schemas.CodeArgsDigestMismatch},
		{"an option not offered", func(b *browser) (string, string) { return x.ApprovalID, x.ArgsDigest }, http.StatusUnprocessableEntity, schemas.CodeOptionNotOffered},
		{"a user who may not decide", func(b *browser) (string, string) {
			b.signIn("mallory")
			return x.ApprovalID, x.ArgsDigest
		}, http.StatusForbidden, schemas.CodeDeciderNotAuthorized},
		{"a personal turn's approval by a team decider", func(b *browser) (string, string) {
			b.signIn("bob")
			return x.ApprovalID, x.ArgsDigest
		}, http.StatusForbidden, schemas.CodeDeciderNotAuthorized},
		{"signed out mid-session, replaying the old cookie", func(b *browser) (string, string) {
			old := b.jar.Cookies(mustURL(in.url))
			b.do("POST", "/signout", url.Values{"csrf": {b.csrf}})
			b.jar.SetCookies(mustURL(in.url), old)
			return x.ApprovalID, x.ArgsDigest
		}, http.StatusUnauthorized, web.CodeSignedOut},
		{"a tampered cookie", func(b *browser) (string, string) {
			c := b.jar.Cookies(mustURL(in.url))[0]
			id, mac, _ := strings.Cut(c.Value, ".")
			c.Value = id[:len(id)-1] + flip(id[len(id)-1]) + "." + mac
			b.jar.SetCookies(mustURL(in.url), []*http.Cookie{c})
			return x.ApprovalID, x.ArgsDigest
		}, http.StatusUnauthorized, web.CodeSignedOut},
		{"an expired session", func(b *browser) (string, string) {
			in.clock.advance(2 * time.Hour)
			return x.ApprovalID, x.ArgsDigest
		}, http.StatusUnauthorized, web.CodeSignedOut},
		{"an unknown approval", func(b *browser) (string, string) { return "a-nope-0", x.ArgsDigest }, http.StatusNotFound, schemas.CodeApprovalNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := in.browser()
			b.signIn("alice")
			id, digest := tc.setup(b)
			option := "approve"
			if tc.code == schemas.CodeOptionNotOffered {
				option = "maybe"
			}
			resp, body := b.decide(id, option, digest)
			if resp.StatusCode != tc.status || resp.Header.Get("Tollgate-Code") != string(tc.code) {
				t.Fatalf("%d %s, want %d %s\n%s", resp.StatusCode, resp.Header.Get("Tollgate-Code"), tc.status, tc.code, body)
			}
			if n := in.webDecisions(x.ApprovalID); n != 0 {
				t.Fatalf("%d decisions published", n)
			}
			if got := in.Approval(x.ApprovalID).Status; got != schemas.ApprovalPending {
				t.Fatalf("approval %s", got)
			}
		})
	}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

// TestDecisionAfterExpiryIsRejected: an approve posted after the approval
// expired is published and rejected by the approver with APPROVAL_EXPIRED,
// which the page shows; the call never runs.
func TestDecisionAfterExpiryIsRejected(t *testing.T) {
	in := startInbox(t, nil)
	a := in.request("carol", "quick", `{"n":1}`, false)
	b := in.browser()
	b.signIn("alice")
	in.WaitApproval(a.ApprovalID, "expired", func(r *schemas.ApprovalRecord) bool { return r.Status == schemas.ApprovalExpired })
	resp, card := b.decide(a.ApprovalID, "approve", a.ArgsDigest)
	if resp.StatusCode != http.StatusConflict || resp.Header.Get("Tollgate-Code") != string(schemas.CodeApprovalExpired) ||
		!strings.Contains(card, "APPROVAL_EXPIRED") || !strings.Contains(card, "expired at") || !strings.Contains(card, "<fieldset disabled>") {
		t.Fatalf("%d %s\n%s", resp.StatusCode, resp.Header.Get("Tollgate-Code"), card)
	}
	if in.webDecisions(a.ApprovalID) != 1 {
		t.Fatal("the decision was not handed to the approver")
	}
}

// TestRateLimitPerPrincipal: past its burst, a principal's decisions are
// refused 429 and not published; another principal is not affected.
func TestRateLimitPerPrincipal(t *testing.T) {
	in := startInbox(t, func(c *web.Config) { c.DecisionRate, c.DecisionBurst = 0.001, 1 })
	a := in.request("carol", "count", `{"n":1}`, true)
	b := in.browser()
	b.signIn("alice")
	if resp, _ := b.decide(a.ApprovalID, "approve", "sha256:wrong"); resp.StatusCode != http.StatusConflict {
		t.Fatalf("first decision: %d", resp.StatusCode)
	}
	resp, _ := b.decide(a.ApprovalID, "approve", a.ArgsDigest)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Tollgate-Code") != string(web.CodeRateLimited) || in.webDecisions(a.ApprovalID) != 0 {
		t.Fatalf("second decision: %d %s", resp.StatusCode, resp.Header.Get("Tollgate-Code"))
	}
	bob := in.browser()
	bob.signIn("bob")
	if resp, _ := bob.decide(a.ApprovalID, "approve", a.ArgsDigest); resp.StatusCode != http.StatusOK {
		t.Fatalf("bob: %d", resp.StatusCode)
	}
}

// sse reads one SSE stream of a browser.
type sse struct {
	resp   *http.Response
	events chan [3]string // id, event, data
}

func (b *browser) events(t *testing.T, after, lastEventID string) *sse {
	t.Helper()
	req, _ := http.NewRequest("GET", b.in.url+"/events?after="+after, nil)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	c := *b.c
	c.Timeout = 0
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	s := &sse{resp: resp, events: make(chan [3]string, 64)}
	go func() {
		defer close(s.events)
		buf := make([]byte, 0, 64<<10)
		var id, ev string
		var data []string
		tmp := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(tmp)
			buf = append(buf, tmp[:n]...)
			for {
				i := strings.IndexByte(string(buf), '\n')
				if i < 0 {
					break
				}
				line := string(buf[:i])
				buf = buf[i+1:]
				switch {
				case line == "":
					if ev != "" {
						s.events <- [3]string{id, ev, strings.Join(data, "\n")}
					}
					ev, data = "", nil
				case strings.HasPrefix(line, "id: "):
					id = line[4:]
				case strings.HasPrefix(line, "event: "):
					ev = line[7:]
				case strings.HasPrefix(line, "data: "):
					data = append(data, line[6:])
				}
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close() })
	return s
}

// next waits for the next event named name whose data contains want.
func (s *sse) next(t *testing.T, name, want string) [3]string {
	t.Helper()
	var got [3]string
	ended := false
	jstest.Eventually(t, 20*time.Second, "a "+name+" event with "+strconv.Quote(want), func() bool {
		for {
			select {
			case e, ok := <-s.events:
				if !ok {
					ended = true
					return true
				}
				if e[1] == name && strings.Contains(e[2], want) {
					got = e
					return true
				}
			default:
				return false
			}
		}
	})
	if ended {
		t.Fatalf("the stream ended waiting for %s %q", name, want)
	}
	return got
}

var afterAttr = `data-after="`

// TestLiveStreamResumesWithoutLoss: a new approval appears as a prompt; an
// approval decided elsewhere (the CLI path) while the browser was
// disconnected arrives, disabled and saying who decided it, when it
// reconnects with Last-Event-ID; its call's result follows; a person who
// may not decide gets none of it; signing out ends the stream.
func TestLiveStreamResumesWithoutLoss(t *testing.T) {
	in := startInbox(t, nil)
	alice, mallory := in.browser(), in.browser()
	page := alice.signIn("alice")
	after := page[strings.Index(page, afterAttr)+len(afterAttr):]
	after = after[:strings.IndexByte(after, '"')]
	live := alice.events(t, after, "")
	mpage := mallory.signIn("mallory")
	mafter := mpage[strings.Index(mpage, afterAttr)+len(afterAttr):]
	mlive := mallory.events(t, mafter[:strings.IndexByte(mafter, '"')], "")

	a := in.request("alice", "count", `{"n":7}`, false) // alice's own turn on the cli transport
	prompt := live.next(t, "prompt", `id="`+a.ApprovalID+`"`)
	if !strings.Contains(prompt[2], a.ArgsDigest) || strings.Contains(prompt[2], "<fieldset disabled>") {
		t.Fatalf("prompt:\n%s", prompt[2])
	}
	live.resp.Body.Close()

	in.Decide(a.ApprovalID, "approve", "alice") // cli:alice, the requester
	in.WaitOutcome(a.TurnID)
	again := alice.events(t, after, prompt[0])
	upd := again.next(t, "update", "approved by cli:alice")
	if !strings.Contains(upd[2], `id="`+a.ApprovalID+`"`) || !strings.Contains(upd[2], "<fieldset disabled>") {
		t.Fatalf("update:\n%s", upd[2])
	}
	res := again.next(t, "update", "Result: ok")
	if !strings.Contains(res[2], "run 1 of "+a.CallID) {
		t.Fatalf("result:\n%s", res[2])
	}
	// mallory's stream saw the same events and was sent none of them: the
	// first event she gets is the prompt of a later approval she may decide.
	q := in.request("carol", "quick", `{"n":8}`, false)
	if e := mlive.next(t, "prompt", ""); !strings.Contains(e[2], `id="`+q.ApprovalID+`"`) {
		t.Fatalf("mallory's first event:\n%s", e[2])
	}

	b := alice.csrf
	alice.do("POST", "/signout", url.Values{"csrf": {b}})
	for e := range again.events {
		if e[1] == "signedout" {
			return
		}
	}
	t.Fatal("the stream ended without a signedout event")
}

// TestExpiredPromptIsDisabledLive: an approval that expires while the page
// is open is sent as an update saying it expired, its buttons disabled.
func TestExpiredPromptIsDisabledLive(t *testing.T) {
	in := startInbox(t, nil)
	b := in.browser()
	page := b.signIn("alice")
	after := page[strings.Index(page, afterAttr)+len(afterAttr):]
	live := b.events(t, after[:strings.IndexByte(after, '"')], "")
	a := in.request("carol", "quick", `{"n":1}`, false)
	live.next(t, "prompt", a.ApprovalID)
	upd := live.next(t, "update", a.ApprovalID)
	if !strings.Contains(upd[2], "expired at") || !strings.Contains(upd[2], "<fieldset disabled>") {
		t.Fatalf("update:\n%s", upd[2])
	}
	jstest.Eventually(t, 5*time.Second, "the approval is expired in KV", func() bool {
		return in.Approval(a.ApprovalID).Status == schemas.ApprovalExpired
	})
	if n := in.webDecisions(a.ApprovalID); n != 0 {
		t.Fatalf("%d decisions were sent", n)
	}
}

// TestTurnTimelineHistoryAndExport: the turn page shows the timeline read
// from the streams (accepted, requested, the decision with principal and
// transport, the result and outcome) to a person who may decide its
// approval, and to nobody else; the history page filters past decisions
// by principal, tool, session and time; the export is JSON lines of the
// same selection's whole timeline.
func TestTurnTimelineHistoryAndExport(t *testing.T) {
	in := startInbox(t, nil)
	a := in.request("carol", "count", `{"n":1}`, true)
	other := in.request("carol", "count", `{"n":2}`, true)
	alice := in.browser()
	alice.signIn("alice")
	if resp, _ := alice.decide(a.ApprovalID, "approve", a.ArgsDigest); resp.StatusCode != http.StatusOK {
		t.Fatalf("approve: %d", resp.StatusCode)
	}
	refused := in.Decision(other.ApprovalID, "approve", web.Transport, "mallory")
	in.Submit(refused)
	in.WaitRejection(refused)
	in.Decide(other.ApprovalID, "deny", "carol")
	in.WaitOutcome(a.TurnID)
	in.WaitOutcome(other.TurnID)

	resp, page := alice.do("GET", "/turns/"+a.TurnID, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("turn page: %d", resp.StatusCode)
	}
	last := 0
	for _, want := range []string{"<strong>accepted</strong>", "<strong>requested</strong>", "approved by <strong>web:alice</strong> (transport web)", "<strong>result</strong>", "<strong>outcome</strong>"} {
		i := strings.Index(page, want)
		if i < last {
			t.Fatalf("the timeline lacks %q after position %d:\n%s", want, last, page)
		}
		last = i
	}
	mallory := in.browser()
	mallory.signIn("mallory")
	if resp, page := mallory.do("GET", "/turns/"+a.TurnID, nil); resp.StatusCode != http.StatusNotFound || strings.Contains(page, a.ApprovalID) {
		t.Fatalf("mallory's turn page: %d", resp.StatusCode)
	}

	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name, query string
		want, not   []string
	}{
		{"every decision", "", []string{a.TurnID, other.TurnID, "web:alice", "cli:carol", "DECIDER_NOT_AUTHORIZED"}, nil},
		{"by principal", "principal=web:alice", []string{a.TurnID}, []string{other.TurnID}},
		{"by session", "session=" + other.SessionID, []string{other.TurnID}, []string{a.TurnID}},
		{"by tool", "tool=quick", nil, []string{a.TurnID, other.TurnID}},
		{"by time", "since=" + url.QueryEscape(future), nil, []string{a.TurnID, other.TurnID}},
	} {
		t.Run("history "+tc.name, func(t *testing.T) {
			resp, page := alice.do("GET", "/history?"+tc.query, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d", resp.StatusCode)
			}
			for _, w := range tc.want {
				if !strings.Contains(page, w) {
					t.Errorf("lacks %q", w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(page, n) {
					t.Errorf("shows %q", n)
				}
			}
		})
	}
	t.Run("export", func(t *testing.T) {
		resp, body := alice.do("GET", "/history.jsonl?session="+a.SessionID, nil)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/jsonl") {
			t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		kinds := map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
			var e struct {
				Kind   string `json:"kind"`
				TurnID string `json:"turn_id"`
			}
			if err := json.Unmarshal([]byte(line), &e); err != nil || e.TurnID != a.TurnID {
				t.Fatalf("line %q: %v", line, err)
			}
			kinds[e.Kind]++
		}
		for _, k := range []string{"accepted", "requested", "decided", "result", "outcome"} {
			if kinds[k] != 1 {
				t.Errorf("%d %s events, want 1 (%v)", kinds[k], k, kinds)
			}
		}
		if _, body := alice.do("GET", "/history.jsonl?turn="+other.TurnID, nil); strings.Contains(body, a.TurnID) || !strings.Contains(body, `"kind":"outcome"`) {
			t.Fatalf("one turn's export:\n%s", body)
		}
		if _, body := mallory.do("GET", "/history.jsonl", nil); strings.TrimSpace(body) != "" {
			t.Fatalf("mallory's export: %q", body)
		}
	})
}
