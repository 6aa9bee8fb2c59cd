package web_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTheDecidersCardShowsTheWholePreview (docs/security.md rule 17): the
// approval.requested event carries the preview's summary only, and the
// inbox card of the person who may decide shows the whole diff all the
// same, live and on the approval's page; anyone else gets neither the card
// nor the lines.
func TestTheDecidersCardShowsTheWholePreview(t *testing.T) {
	in := startPreviewInbox(t)
	if err := os.WriteFile(filepath.Join(in.Sandbox, "private.txt"), []byte("salary 123456\nbank PIN 4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	alice := in.browser()
	page := alice.signIn("alice")
	after := page[strings.Index(page, afterAttr)+len(afterAttr):]
	live := alice.events(t, after[:strings.IndexByte(after, '"')], "")

	a := in.request("carol", "write_file", `{"path":"private.txt","content":"x\n"}`, false)
	if reqs := in.WaitRequested(a.TurnID, 1); len(reqs) != 1 || reqs[0].Preview == nil || !reqs[0].Preview.Redacted || reqs[0].Preview.Text != "" {
		t.Fatalf("approval.requested events %+v, want the preview's summary only", reqs)
	}
	prompt := live.next(t, "prompt", a.ApprovalID)
	for _, want := range []string{"-salary 123456", "-bank PIN 4242", "&#43;x", "&#43;1 -2 lines"} {
		if !strings.Contains(prompt[2], want) {
			t.Errorf("the decider's live card lacks %q:\n%s", want, prompt[2])
		}
	}
	resp, card := alice.do("GET", "/approvals/"+a.ApprovalID, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(card, "-salary 123456") {
		t.Errorf("the decider's approval page (%d) lacks the old lines:\n%s", resp.StatusCode, card)
	}
	mallory := in.browser()
	mallory.signIn("mallory")
	if resp, page := mallory.do("GET", "/approvals/"+a.ApprovalID, nil); resp.StatusCode != http.StatusNotFound || strings.Contains(page, "salary") {
		t.Errorf("someone who may not decide got %d:\n%s", resp.StatusCode, page)
	}
}
