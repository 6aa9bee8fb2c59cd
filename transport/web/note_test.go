package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

// TestTheNoteIsKeptAndShownEverywhere: a deny posted with a note (the
// reason, with a hidden character) keeps it with the decision: the
// record holds it as sent, and the decided card, the turn's timeline, the
// history page (each showing it escaped) and the export (as sent) show it.
func TestTheNoteIsKeptAndShownEverywhere(t *testing.T) {
	in := startInbox(t, nil)
	a := in.request("carol", "count", `{"n":1}`, true)
	b := in.browser()
	b.signIn("alice")
	const note = "wrong file \u202e use notes/b.txt"
	const shown = `wrong file \u202E use notes/b.txt`
	resp, card := b.do("POST", "/approvals/"+a.ApprovalID+"/decision",
		url.Values{"csrf": {b.token()}, "option": {"deny"}, "digest": {a.ArgsDigest}, "note": {note}}, "Tollgate-Fragment", "card")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("deny: %d\n%s", resp.StatusCode, card)
	}
	if rec := in.Approval(a.ApprovalID); rec.Status != schemas.ApprovalDenied || rec.Decision.Note != note {
		t.Fatalf("approval %s with note %q, want denied with %q", rec.Status, rec.Decision.Note, note)
	}
	in.WaitTerminal(a.TurnID)
	for _, page := range []struct{ name, body string }{
		{"the decided card", card},
		{"the turn's timeline", get(b, "/turns/"+a.TurnID)},
		{"the history", get(b, "/history")},
	} {
		if !strings.Contains(page.body, `<q class="note">`+shown+`</q>`) || strings.Contains(page.body, "\u202e") {
			t.Errorf("%s does not show the note escaped:\n%s", page.name, page.body)
		}
	}
	if export := get(b, "/history.jsonl?turn="+a.TurnID); !strings.Contains(export, `"note":"`+note+`"`) {
		t.Errorf("the export lacks the note:\n%s", export)
	}
}

// get is the body of a 200 answer to GET path.
func get(b *browser, path string) string {
	b.in.t.Helper()
	resp, body := b.do("GET", path, nil)
	if resp.StatusCode != http.StatusOK {
		b.in.t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, body)
	}
	return body
}
