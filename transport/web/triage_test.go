package web_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// TestTriageInARealBrowser: with 300 approvals pending (or
// $TOLLGATE_TRIAGE_PENDING: `TOLLGATE_TRIAGE_PENDING=10000 go test -run
// TestTriageInARealBrowser ./transport/web/` runs it at the volume the inbox
// is built for, by hand: make test keeps it short), headless chromium
// gets a first page of web.PageRows compact rows, newest first, well under
// 150 KiB, with the count in the title; the next page goes on where it
// ended; the filter form narrows the list; a new prompt arrives live at
// the top with an "N new" notice, the title's count up by one and the
// polite live region announcing it; and it is approved with the keyboard
// alone (j, then a to open its card, a again to approve through the card's
// form), the count going down again.
func TestTriageInARealBrowser(t *testing.T) {
	exe := chromiumPath(t)
	in := startInbox(t, nil)
	n := 300
	if v := os.Getenv("TOLLGATE_TRIAGE_PENDING"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 2*web.PageRows {
			t.Fatalf("TOLLGATE_TRIAGE_PENDING=%q: want a whole number of at least %d", v, 2*web.PageRows)
		}
	}
	title := func(k int) string { return jsString("(" + strconv.Itoa(k) + ") Approvals · Tollgate") }
	recs := in.seedPending(n, time.Now().UTC().Add(-6*time.Hour))
	newest := func(i int) string { return recs[n-1-i].ApprovalID }
	alice := headless(t, exe)
	in.signInAs(t, alice, "alice")

	do(t, alice, "the first page: 50 rows, newest first, the count in the title",
		chromedp.Navigate(in.url+"/?sort=newest"), chromedp.WaitVisible(chromedp.ID("rows")),
		until(`document.body.dataset.connected === "1"`),
		until(`document.querySelectorAll("li.row").length === `+strconv.Itoa(web.PageRows)),
		until(`document.querySelector("li.row").dataset.approval === `+jsString(newest(0))),
		until(`document.querySelectorAll("li.row")[`+strconv.Itoa(web.PageRows-1)+`].dataset.approval === `+jsString(newest(web.PageRows-1))),
		until(`document.title === `+title(n)),
		until(`document.documentElement.outerHTML.length < 150 * 1024`))
	screenshotView(t, alice, "inbox.png")

	c, cancel := context.WithTimeout(alice, 10*time.Second)
	next, err := chromedp.Run(c, chromedp.Evaluate[string](`document.querySelector("a[rel=next]").href`))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	do(t, alice, "the next page",
		chromedp.Navigate(next),
		until(`document.querySelector("li.row") && document.querySelector("li.row").dataset.approval === `+jsString(newest(web.PageRows))))

	do(t, alice, "filter by requester with the form",
		chromedp.Navigate(in.url+"/?sort=newest"), chromedp.WaitVisible(chromedp.ID("f-requester")),
		chromedp.SendKeys(chromedp.ID("f-requester"), "cli:u1"),
		chromedp.Submit(chromedp.ID("f-requester")))
	navigated(t, alice, `location.search.indexOf("requester=cli%3Au1") >= 0 && document.readyState === "complete"`)
	do(t, alice, "the filtered list",
		until(`document.getElementById("total") && document.getElementById("total").textContent === "`+strconv.Itoa((n+1)/3)+`"`),
		until(`Array.prototype.every.call(document.querySelectorAll("li.row"), r => r.dataset.requester === "cli:u1")`))

	do(t, alice, "back to the whole list", chromedp.Navigate(in.url+"/?sort=newest"), chromedp.WaitVisible(chromedp.ID("rows")),
		until(`document.body.dataset.connected === "1"`))
	a := in.request("carol", "count", `{"path":"notes/new.txt"}`, true)
	do(t, alice, "the new prompt: at the top, N new, the title, announced",
		until(`document.querySelector("li.row").dataset.approval === `+jsString(a.ApprovalID)),
		chromedp.WaitVisible(chromedp.ID("new-notice")),
		until(`document.getElementById("new-link").textContent.indexOf("1 new approval") === 0`),
		until(`document.title === `+title(n+1)),
		until(`document.getElementById("live-status").textContent.indexOf("New approval waiting: count requested by cli:carol") >= 0`))

	do(t, alice, "j selects it, a opens its card, a again approves it",
		chromedp.KeyEvent("j"),
		until(`document.activeElement.closest("li.row").dataset.approval === `+jsString(a.ApprovalID)),
		chromedp.KeyEvent("a"),
		chromedp.WaitVisible(chromedp.CSS(cardSel(a.ApprovalID)+` button[value=approve]`)),
		until(`document.getElementById("live-status").textContent.indexOf("press a again") >= 0`))
	screenshotView(t, alice, "inbox-card.png")
	do(t, alice, "approved through the card's form",
		chromedp.KeyEvent("a"),
		chromedp.WaitVisible(chromedp.CSS(cardSel(a.ApprovalID)+` .verdict-applied`)),
		until(`document.title === `+title(n)))
	if rec := in.Approval(a.ApprovalID); rec.Status != schemas.ApprovalApproved || rec.Decision.Principal != "web:alice" {
		t.Fatalf("approval %s by %+v, want approved by web:alice", rec.Status, rec.Decision)
	}
}

// navigated waits, through a navigation (whose page change fails a
// read in flight), until the JavaScript expression is true.
func navigated(t *testing.T, ctx context.Context, expr string) {
	t.Helper()
	jstest.Eventually(t, 25*time.Second, "after the navigation: "+expr, func() bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		ok, err := chromedp.Run(c, chromedp.Evaluate[bool](expr))
		return err == nil && ok
	})
}
