package discord_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A prompt says what a write over an existing file would change in
// summary only (docs/security.md rule 17): "+1 -2 lines", never the lines
// of the file, which only the inbox card of a decider shows.
func TestPromptShowsThePreviewSummaryOnly(t *testing.T) {
	r := startRig(t)
	if err := os.WriteFile(filepath.Join(r.h.Sandbox, "private.txt"), []byte("salary 123456\nbank PIN 4242\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := r.askOK(t, "111", dmOf("111"), "write private.txt")
	if a := r.h.WaitPending(id); a.Preview == nil || !strings.Contains(a.Preview.Text, "salary 123456") {
		t.Fatalf("stored preview %+v, want the whole diff", a.Preview)
	}
	p := r.promptOf(t, id)
	if c := p.content(); strings.Contains(c, "salary") || strings.Contains(c, "4242") {
		t.Errorf("the prompt holds the old lines: %q", c)
	}
	if !strings.Contains(p.content(), "change: `+1 -2 lines`") {
		t.Errorf("the prompt does not say what it would change in short: %q", p.content())
	}
}
