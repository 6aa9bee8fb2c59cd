package web_test

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// forged sends method path as browser b (its cookies) with Host host
// (when not "") and, when origin is not "", that Origin; it follows no
// redirect.
func (b *browser) forged(method, path, host, origin string, form url.Values) (*http.Response, string) {
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
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	// This browser's cookies, sent whatever the Host (the jar would pick
	// them by Host): a forged request is refused even with them.
	for _, c := range b.jar.Cookies(req.URL) {
		req.AddCookie(c)
	}
	resp, err := (&http.Client{Timeout: b.c.Timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		b.in.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, string(out)
}

// TestDevInboxRefusesDNSRebinding: a page of another site whose name
// resolves to 127.0.0.1 reaches the dev inbox from loopback; its requests
// name that site in Host (refused, whatever the path: nothing read, no
// one signed in) and its posts carry that site's Origin (refused: no
// sign-in, no decision published). The inbox's own pages still work.
func TestDevInboxRefusesDNSRebinding(t *testing.T) {
	in := startInbox(t, nil)
	port := in.url[strings.LastIndexByte(in.url, ':')+1:]
	a := in.request("carol", "count", `{"n":1}`, false)
	b := in.browser()

	for _, path := range []string{"/signin", "/", "/turns/" + a.TurnID} {
		resp, body := b.forged("GET", path, "attacker.example:"+port, "", nil)
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Tollgate-Code") != string(web.CodeHostNotLoopback) || !strings.Contains(body, `"attacker.example:`+port+`"`) || strings.Contains(body, `name="csrf"`) {
			t.Fatalf("GET %s with Host attacker.example: %d %q\n%s", path, resp.StatusCode, resp.Header.Get("Tollgate-Code"), body)
		}
	}
	b.do("GET", "/signin", nil) // a token of this browser's own session
	resp, body := b.forged("POST", "/signin/dev", "attacker.example:"+port, "http://attacker.example:"+port, url.Values{"csrf": {b.token()}, "subject": {"alice"}})
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Tollgate-Code") != string(web.CodeHostNotLoopback) {
		t.Fatalf("dev sign-in with Host attacker.example: %d\n%s", resp.StatusCode, body)
	}
	resp, body = b.forged("POST", "/signin/dev", "", "http://attacker.example:"+port, url.Values{"csrf": {b.token()}, "subject": {"alice"}})
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Tollgate-Code") != string(web.CodeOriginMismatch) {
		t.Fatalf("dev sign-in with Origin attacker.example: %d\n%s", resp.StatusCode, body)
	}
	if _, page := b.do("GET", "/", nil); strings.Contains(page, "web:alice") {
		t.Fatal("a refused sign-in signed the browser in")
	}

	b.signIn("alice") // through 127.0.0.1, no Origin: as before
	for _, origin := range []string{"http://attacker.example:" + port, "null", "http://localhost:1"} {
		resp, body = b.forged("POST", "/approvals/"+a.ApprovalID+"/decision", "", origin, url.Values{"csrf": {b.token()}, "option": {"approve"}, "digest": {a.ArgsDigest}})
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Tollgate-Code") != string(web.CodeOriginMismatch) {
			t.Fatalf("decision with Origin %s: %d\n%s", origin, resp.StatusCode, body)
		}
	}
	resp, body = b.forged("POST", "/approvals/"+a.ApprovalID+"/decision", "localhost:"+port, "http://localhost:"+port, url.Values{"csrf": {b.token()}, "option": {"deny"}, "digest": {a.ArgsDigest}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("decision from the inbox's own origin (localhost): %d\n%s", resp.StatusCode, body)
	}
	// The one decision published is the same-origin deny.
	rec := in.WaitApproval(a.ApprovalID, "decided", func(r *schemas.ApprovalRecord) bool { return r.Status != schemas.ApprovalPending })
	if n := in.webDecisions(a.ApprovalID); n != 1 || rec.Status != schemas.ApprovalDenied {
		t.Fatalf("%d web decisions, approval %s; want only the same-origin deny", n, rec.Status)
	}
}
