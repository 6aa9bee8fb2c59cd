package web_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tollgate-dev/tollgate/schemas"
)

// chromiumPath finds Debian's chromium. Without it the browser tests skip,
// except under CI=true, where they fail (.ci/run installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (apt-get install chromium): the browser tests must run in CI")
	}
	t.Skip("chromium is not installed (apt-get install chromium); CI=true makes this a failure")
	return ""
}

// headless starts a fresh headless chromium (its own user-data-dir) for
// the test and returns its context; each call is a separate browser, with
// its own cookies.
func headless(t *testing.T, exe string) context.Context {
	t.Helper()
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1000, 900),
	)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser, with no timeout on it
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// do runs steps within 30 seconds.
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		h, hcancel := context.WithTimeout(ctx, 5*time.Second)
		defer hcancel()
		html, _ := chromedp.Run(h, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("%s: %v\npage:\n%s", what, err, html)
	}
}

// text returns the text of sel.
//
// A live page re-renders a card in place (the SSE update replaces its
// HTML), so an element can be read in the moment it is empty or replaced:
// an empty text or a failed read is tried again until the deadline (none
// of the texts read here is meant to be empty).
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		// Each read gets a short deadline of its own: a read of a node
		// replaced meanwhile fails ("No node with given id"), and is
		// tried again on the new one.
		rc, rcancel := context.WithTimeout(c, 5*time.Second)
		s, err := chromedp.Run(rc, chromedp.Text(chromedp.CSS(sel)))
		rcancel()
		if err == nil && strings.TrimSpace(s) != "" {
			return s
		}
		select {
		case <-c.Done():
			if err != nil {
				t.Fatalf("text of %s: %v", sel, err)
			}
			return s
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// until waits for the JavaScript expression to be true.
func until(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(25*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))
}

// card is the CSS selector of approval id's card.
func cardSel(id string) string { return `article.card[id="` + id + `"]` }

// rowSel is the CSS selector of approval id's row in the list.
func rowSel(id string) string { return `li.row[id="row-` + id + `"]` }

// opened opens approval id's row in the list, once it is there, and waits
// for its card in it (fetched when the row had only its link).
func opened(id string) chromedp.Action[chromedp.Void] {
	return until(`(function () { var d = document.querySelector(` + jsString(rowSel(id)+" details") + `);
		if (!d) { return false; } d.open = true; return d.querySelector("article.card form.decide") !== null; })()`)
}

// signInAs signs in with the dev form and waits for the live stream.
func (in *inbox) signInAs(t *testing.T, ctx context.Context, subject string) {
	t.Helper()
	do(t, ctx, "dev sign-in as "+subject,
		chromedp.Navigate(in.url+"/signin"),
		chromedp.SendKeys(chromedp.ID("subject"), subject),
		chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)),
		chromedp.WaitVisible(chromedp.ID("principal")),
	)
	if got := text(t, ctx, "#principal"); got != "web:"+subject {
		t.Fatalf("signed in as %q, want web:%s", got, subject)
	}
	do(t, ctx, "the live stream opens", until(`document.body.dataset.connected === "1"`))
}

// screenshot saves a full-page PNG of ctx as name in $TOLLGATE_SCREENSHOTS
// (the README's images: docs/img), when that is set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	saveScreenshot(t, ctx, name, chromedp.FullScreenshot(100))
}

// screenshotView saves a PNG of the window only (the list is long) as name
// in $TOLLGATE_SCREENSHOTS, when that is set.
func screenshotView(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	saveScreenshot(t, ctx, name, chromedp.CaptureScreenshot())
}

// saveScreenshot runs capture and writes its PNG to $TOLLGATE_SCREENSHOTS
// as name; it does nothing when that is not set.
func saveScreenshot(t *testing.T, ctx context.Context, name string, capture chromedp.Action[[]byte]) {
	t.Helper()
	dir := os.Getenv("TOLLGATE_SCREENSHOTS")
	if dir == "" {
		return
	}
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(c, capture)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestInboxInARealBrowser drives the inbox in headless chromium: dev
// sign-in; a turn sent like the CLI sends one appears live; approving it
// shows the verdict and then the call's result; a second browser sees it
// disabled; an approval decided through the CLI path is disabled in the
// open page; a prompt that expires shows as expired; a principal who may
// decide nothing sees nothing to decide; a prompt is decided with the
// keyboard alone; the turn's timeline shows who decided; the pages fit a
// phone's width.
func TestInboxInARealBrowser(t *testing.T) {
	exe := chromiumPath(t)
	in := startInbox(t, nil)
	alice, bob := headless(t, exe), headless(t, exe)
	in.signInAs(t, alice, "alice")
	in.signInAs(t, bob, "bob")

	// A team turn of carol's: alice and bob may decide it.
	a := in.request("carol", "count", `{"path":"notes/carol.txt","content":"buy milk"}`, true)
	sel := cardSel(a.ApprovalID)
	do(t, alice, "the prompt appears live", opened(a.ApprovalID), chromedp.WaitVisible(chromedp.CSS(sel+` button[value=approve]`)))
	do(t, bob, "the prompt appears live in the second browser", opened(a.ApprovalID), chromedp.WaitVisible(chromedp.CSS(sel)))
	if got := text(t, alice, sel+" .digest"); got != a.ArgsDigest {
		t.Fatalf("digest shown %q, want %q", got, a.ArgsDigest)
	}
	other := in.request("carol", "count", `{"n":2}`, true)
	do(t, alice, "a second prompt appears", opened(other.ApprovalID), chromedp.WaitVisible(chromedp.CSS(cardSel(other.ApprovalID))))

	do(t, alice, "approve, with a note",
		chromedp.SendKeys(chromedp.CSS(sel+` input[name=note]`), "looks right"),
		chromedp.Click(chromedp.CSS(sel+` button[value=approve]`)),
		chromedp.WaitVisible(chromedp.CSS(sel+` .verdict-applied`)),
		chromedp.WaitVisible(chromedp.CSS(sel+` .result-ok`)),
	)
	if got := text(t, alice, sel+" .result"); !strings.Contains(got, "run 1 of "+a.CallID) {
		t.Fatalf("result shown: %q", got)
	}
	if rec := in.Approval(a.ApprovalID); rec.Status != schemas.ApprovalApproved || rec.Decision.Principal != "web:alice" {
		t.Fatalf("approval %s by %+v", rec.Status, rec.Decision)
	}
	do(t, bob, "the second browser shows it decided, disabled",
		chromedp.WaitVisible(chromedp.CSS(sel+`[data-status=approved] fieldset[disabled]`)))
	if got := text(t, bob, sel+" .why"); !strings.Contains(got, "approved by web:alice") {
		t.Fatalf("bob's page says %q", got)
	}

	in.Decide(other.ApprovalID, "approve", "carol") // the CLI path: cli:carol, the requester
	do(t, alice, "an approval decided with the CLI is disabled in the open page",
		chromedp.WaitVisible(chromedp.CSS(cardSel(other.ApprovalID)+`[data-status=approved] fieldset[disabled]`)))
	if got := text(t, alice, cardSel(other.ApprovalID)+" .why"); !strings.Contains(got, "approved by cli:carol") {
		t.Fatalf("alice's page says %q", got)
	}

	q := in.request("carol", "quick", `{"n":3}`, false)
	do(t, alice, "a prompt that expires shows as expired",
		opened(q.ApprovalID),
		chromedp.WaitVisible(chromedp.CSS(cardSel(q.ApprovalID)+`[data-status=expired] fieldset[disabled]`)))
	if got := text(t, alice, cardSel(q.ApprovalID)+" .why"); !strings.Contains(got, "expired at") {
		t.Fatalf("expired card says %q", got)
	}

	mallory := headless(t, exe)
	in.signInAs(t, mallory, "mallory")
	pending := in.request("carol", "count", `{"n":4}`, true)
	do(t, alice, "a later prompt reaches alice", opened(pending.ApprovalID), chromedp.WaitVisible(chromedp.CSS(cardSel(pending.ApprovalID))))
	do(t, mallory, "an unauthorized principal sees nothing to decide",
		chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("empty")),
		until(`document.querySelectorAll("li.row, article.card").length === 0 && document.querySelectorAll("button[value=approve]").length === 0`))

	ps := cardSel(pending.ApprovalID)
	do(t, alice, "deny with the keyboard alone: Enter in the note decides nothing, Tab Tab Enter denies",
		chromedp.Focus(chromedp.CSS(ps+` input[name=note]`)),
		chromedp.KeyEvent("wrong file\r"),
		chromedp.KeyEvent("\t\t"),
		until(`document.activeElement && document.activeElement.value === "deny"`),
		chromedp.KeyEvent("\r"),
		chromedp.WaitVisible(chromedp.CSS(ps+` .verdict-applied`)))
	if rec := in.Approval(pending.ApprovalID); rec.Status != schemas.ApprovalDenied || rec.Decision.Principal != "web:alice" {
		t.Fatalf("approval %s by %+v, want denied by web:alice", rec.Status, rec.Decision)
	}
	if got := text(t, alice, ps+" .decision-note"); !strings.Contains(got, "wrong file") {
		t.Fatalf("the decided card shows the note %q, want the deny reason", got)
	}

	do(t, alice, "the turn's timeline",
		chromedp.Navigate(in.url+"/turns/"+a.TurnID),
		chromedp.WaitVisible(chromedp.CSS(`ol.timeline li.ev-outcome`)))
	if got := text(t, alice, "ol.timeline"); !strings.Contains(got, "approved by web:alice (transport web)") {
		t.Fatalf("timeline: %q", got)
	}
	screenshot(t, alice, "turn.png")

	do(t, alice, "the inbox and the timeline fit a phone's width",
		chromedp.EmulateViewport(390, 844),
		chromedp.Reload(),
		until(`document.documentElement.scrollWidth <= window.innerWidth`),
		chromedp.Navigate(in.url+"/"),
		chromedp.WaitVisible(chromedp.ID("principal")),
		until(`document.documentElement.scrollWidth <= window.innerWidth`))
}

// TestOIDCSignInInARealBrowser: a browser signs in through a real OpenID
// provider (code flow with PKCE) and lands in its inbox as web:<sub>.
func TestOIDCSignInInARealBrowser(t *testing.T) {
	exe := chromiumPath(t)
	in, p := startOIDCInbox(t)
	p.set([]string{"pwd", "otp"}, "")
	b := headless(t, exe)
	do(t, b, "OIDC sign-in",
		chromedp.Navigate(in.url+"/signin"),
		chromedp.Click(chromedp.ID("oidc")),
		chromedp.WaitVisible(chromedp.ID("principal")))
	if got := text(t, b, "header .who"); !strings.Contains(got, "web:id2") || !strings.Contains(got, "second factor") {
		t.Fatalf("signed in as %q", got)
	}
}

// TestGrantInARealBrowser: in headless chromium, alice chooses a card's
// "approve-session" grant button (its summary shown); the next call of
// the same session and requester is decided by the grant, with no prompt
// in the open inbox; she revokes the grant on the Grants page, which then
// shows it revoked; and a third call of the session prompts again.
func TestGrantInARealBrowser(t *testing.T) {
	exe := chromiumPath(t)
	in := startInbox(t, nil)
	alice := headless(t, exe)
	in.signInAs(t, alice, "alice")

	session := in.NextID("s")
	a := in.WaitPending(schemas.ApprovalID(in.send(session, "carol", "files", `{"path":"notes/a.txt"}`, true), 0))
	sel := cardSel(a.ApprovalID)
	grant := sel + ` button.grant[value="approve-session"]`
	do(t, alice, "the prompt appears live with its grant offers", opened(a.ApprovalID), chromedp.WaitVisible(chromedp.CSS(grant)))
	offer, _ := a.Offer("approve-session")
	if got := text(t, alice, grant+" .grant-summary"); got != offer.Summary {
		t.Fatalf("the grant button says %q, want %q", got, offer.Summary)
	}
	screenshot(t, alice, "grant-offers.png")
	do(t, alice, "choose the session grant",
		chromedp.Click(chromedp.CSS(grant)),
		chromedp.WaitVisible(chromedp.CSS(sel+` .verdict-applied`)))
	gid := in.grantOf(a.ApprovalID)

	second := in.send(session, "carol", "files", `{"path":"other/b.txt"}`, true)
	in.decidedByGrant(t, second, gid)
	do(t, alice, "no prompt for the call the grant decided",
		until(`document.getElementById(`+jsString(schemas.ApprovalID(second, 0))+`) === null && document.getElementById(`+jsString("row-"+schemas.ApprovalID(second, 0))+`) === null`))

	row := `li.grant-row[data-grant="` + gid + `"]`
	do(t, alice, "revoke it on the Grants page",
		chromedp.Navigate(in.url+"/grants"),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state=live]`)),
		chromedp.SendKeys(chromedp.CSS(row+` input[name=reason]`), "done for today"),
		chromedp.Click(chromedp.CSS(row+` form.revoke button`)),
		chromedp.WaitVisible(chromedp.CSS(row+`[data-state=revoked]`)))
	if g := in.grant(gid); g.Revoked == nil || g.Revoked.By != "web:alice" || g.Revoked.Reason != "done for today" {
		t.Fatalf("revocation %+v", g.Revoked)
	}
	screenshot(t, alice, "grants.png")

	third := in.WaitPending(schemas.ApprovalID(in.send(session, "carol", "files", `{"path":"other/c.txt"}`, true), 0))
	do(t, alice, "a third call prompts again",
		chromedp.Navigate(in.url+"/"),
		opened(third.ApprovalID),
		chromedp.WaitVisible(chromedp.CSS(cardSel(third.ApprovalID)+` button[value=approve]`)))
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string { return strconv.Quote(s) }
