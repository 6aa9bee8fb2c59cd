package slack_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

// A prompt says what a write over an existing file would change in
// summary only (docs/security.md rule 17): "+1 -2 lines", never the lines
// of the file, which only the inbox card of a decider shows.
func TestPromptShowsThePreviewSummaryOnly(t *testing.T) {
	r := startRig(t)
	if err := os.WriteFile(filepath.Join(r.h.Sandbox, "private.txt"), []byte("salary 123456\nbank PIN 4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const ch, ts = "DU1", "1700000300.000100"
	r.event(t, "EvPriv", dm("U1", ch, ts, "write private.txt"))
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	if a := r.h.WaitPending(id); a.Preview == nil || !strings.Contains(a.Preview.Text, "salary 123456") {
		t.Fatalf("stored preview %+v, want the whole diff", a.Preview)
	}
	b := r.promptOf(t, id).form.Get("blocks")
	if strings.Contains(b, "salary") || strings.Contains(b, "4242") {
		t.Errorf("the prompt holds the old lines: %s", b)
	}
	if !strings.Contains(texts(t, b), "change: +1 -2 lines") {
		t.Errorf("the prompt does not say what it would change in short: %s", b)
	}
}
