package web_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/tollgate-dev/tollgate/schemas"
)

// TestQuorumVotesShowLive: a pair call needs two of alice, bob and dave.
// Alice's open page shows 0 of 2; dave's vote (from another browser)
// updates her open card live, without a reload: 1 of 2, dave's vote with
// its note, and who is still needed (alice and bob, not dave); the note
// she is typing survives the update. Her approve then completes it.
func TestQuorumVotesShowLive(t *testing.T) {
	exe := chromiumPath(t)
	in := startInbox(t, nil)
	alice := headless(t, exe)
	in.signInAs(t, alice, "alice")
	a := in.request("carol", "pair", `{"n":1}`, true)
	sel := cardSel(a.ApprovalID)
	do(t, alice, "the quorum prompt arrives", opened(a.ApprovalID), chromedp.WaitVisible(chromedp.CSS(sel+` .still-needed`)),
		chromedp.SendKeys(chromedp.CSS(sel+` input[name=note]`), "fine by me"))
	if got := text(t, alice, sel+" .votes"); !strings.Contains(got, "0 of 2") || !strings.Contains(got, "2 more approvals, from web:alice, web:bob, web:dave") {
		t.Fatalf("votes shown %q", got)
	}

	dave := in.browser()
	dave.signIn("dave")
	if resp, body := dave.decide(a.ApprovalID, "approve", a.ArgsDigest); resp.Header.Get("Tollgate-Verdict") != "vote" {
		t.Fatalf("dave's approve: %d %s\n%s", resp.StatusCode, resp.Header.Get("Tollgate-Verdict"), body)
	}
	do(t, alice, "dave's vote shows in the open card, live",
		until(`(document.querySelector(`+jsString(sel+` .vote-count`)+`) || {}).textContent === "1 of 2 approvals"`))
	got := text(t, alice, sel+" .votes")
	if !strings.Contains(got, "web:dave approve") || !strings.Contains(got, "from the test") || !strings.Contains(got, "1 more approval, from web:alice, web:bob") || strings.Contains(got, "from web:alice, web:bob, web:dave") {
		t.Fatalf("votes shown %q", got)
	}
	do(t, alice, "the note being typed survived the update, and her approve completes the quorum",
		until(`document.querySelector(`+jsString(sel+` input[name=note]`)+`).value === "fine by me"`),
		chromedp.Click(chromedp.CSS(sel+` button[value=approve]`)),
		chromedp.WaitVisible(chromedp.CSS(sel+` .verdict-applied`)))
	if rec := in.Approval(a.ApprovalID); rec.Status != schemas.ApprovalApproved || len(rec.Votes) != 2 || rec.Votes[1].Note != "fine by me" {
		t.Fatalf("approval %s votes %+v", rec.Status, rec.Votes)
	}
}
