package schemas_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/schemas"
)

func TestPreviewSummary(t *testing.T) {
	for _, tc := range []struct {
		p    *schemas.ApprovalPreview
		want string
	}{
		{nil, ""},
		{&schemas.ApprovalPreview{Status: schemas.PreviewUnsupported}, ""},
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindDiff,
			Text: "--- a\n+++ a\n@@ -1,2 +1,4 @@\n x\n-y\n+z\n+--- not a header\n+w\n"}, "+3 -1 lines"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindNewFile, Text: "a\nb"}, "new file, 2 lines"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindNewFile, Text: "a\n"}, "new file, 1 line"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindUnchanged}, "no change"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindText, Text: "drops table users\nand more"}, "drops table users"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewFailed, Reason: "backend down"}, "preview failed: backend down"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewTimedOut, Reason: "no preview within 2s"}, "preview timed out"},
	} {
		if got := tc.p.Summary(); got != tc.want {
			t.Errorf("Summary of %+v = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// FuzzDiffLines: any text splits into lines that give it back, and a
// summary of any preview is valid UTF-8 when its text is.
func FuzzDiffLines(f *testing.F) {
	f.Add("--- a\n+++ a\n@@ -1 +1 @@\n-x\n+y\n")
	f.Add("")
	f.Add("\n\n+")
	f.Add(strings.Repeat("é", 100))
	f.Fuzz(func(t *testing.T, text string) {
		var b strings.Builder
		for _, l := range schemas.DiffLines(text) {
			b.WriteString(l.Text + "\n")
		}
		if want := strings.TrimSuffix(text, "\n"); strings.TrimSuffix(b.String(), "\n") != want {
			t.Fatalf("lines of %q give back %q", text, b.String())
		}
		p := &schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindText, Text: text}
		if s := p.Summary(); utf8.ValidString(text) && !utf8.ValidString(s) {
			t.Fatalf("summary %q of valid text is not UTF-8", s)
		}
	})
}
