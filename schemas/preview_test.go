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
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindText, Text: "drops table users\nand more"}, "description, 2 lines"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewFailed, Reason: "backend down"}, "preview failed"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindDiff, Redacted: true, Added: 2, Removed: 5}, "+2 -5 lines"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindNewFile, Redacted: true, Lines: 7}, "new file, 7 lines"},
		{&schemas.ApprovalPreview{Status: schemas.PreviewTimedOut, Reason: "no preview within 2s"}, "preview timed out"},
	} {
		if got := tc.p.Summary(); got != tc.want {
			t.Errorf("Summary of %+v = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// Only the lines a hunk header announces count as added or removed: "+"
// and "-" lines before the first hunk (what a path with newlines in the
// header would forge) or beyond a hunk's counts are context.
func TestDiffLinesCountOnlyRealHunkLines(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       string
	}{
		{"a plain diff", "--- a\n+++ a\n@@ -1,2 +1,2 @@\n x\n-y\n+z\n", "+1 -1 lines"},
		{"lines forged in the header", "--- a\n-salary 123456\n-bank PIN 4242\n+++ a\n+owned\n@@ -1 +1 @@\n-x\n+y\n", "+1 -1 lines"},
		{"lines beyond the hunk's counts", "--- a\n+++ a\n@@ -1 +1 @@\n-x\n+y\n-extra\n+more\n", "+1 -1 lines"},
		{"a hunk without counts is one line each", "@@ -3 +3 @@\n-x\n+y\n", "+1 -1 lines"},
		{"two hunks", "@@ -1,1 +1,2 @@\n-a\n+b\n+c\n@@ -9,2 +10,1 @@\n-d\n e\n", "+2 -2 lines"},
		{"a malformed hunk header counts nothing", "@@ nonsense @@\n-x\n+y\n", "+0 -0 lines"},
		{"no hunk at all", "-x\n+y\n", "+0 -0 lines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindDiff, Text: tc.text}
			if got := p.Summary(); got != tc.want {
				t.Errorf("summary %q, want %q (lines %+v)", got, tc.want, schemas.DiffLines(tc.text))
			}
			if got := p.SummaryOnly().Summary(); got != tc.want {
				t.Errorf("summary-only summary %q, want %q", got, tc.want)
			}
		})
	}
}

// SummaryOnly keeps the status, kind, counts, time and truncation and
// nothing of the content; a record's SummaryOnly changes only its copy.
func TestSummaryOnlyDisclosesNoContent(t *testing.T) {
	secret := "salary 123456"
	for _, p := range []*schemas.ApprovalPreview{
		{Status: schemas.PreviewOK, Kind: schemas.PreviewKindDiff, Text: "--- n\n+++ n\n@@ -1 +1 @@\n-" + secret + "\n+x\n", Truncated: true},
		{Status: schemas.PreviewOK, Kind: schemas.PreviewKindNewFile, Text: secret + "\n"},
		{Status: schemas.PreviewOK, Kind: schemas.PreviewKindText, Text: "replaces " + secret},
		{Status: schemas.PreviewFailed, Reason: "cannot parse " + secret},
	} {
		s := p.SummaryOnly()
		if !s.Redacted || s.Text != "" || s.Reason != "" || s.Status != p.Status || s.Kind != p.Kind || s.Truncated != p.Truncated ||
			s.Summary() != p.Summary() || strings.Contains(s.Summary(), secret) {
			t.Errorf("summary only of %+v = %+v (%q)", p, s, s.Summary())
		}
	}
	rec := &schemas.ApprovalRecord{ApprovalID: "a-0", Preview: &schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: schemas.PreviewKindNewFile, Text: secret}}
	if got := rec.SummaryOnly(); got == rec || got.Preview.Text != "" || rec.Preview.Text != secret || got.ApprovalID != "a-0" {
		t.Fatalf("record summary only %+v, original now %+v", got.Preview, rec.Preview)
	}
	if none := (&schemas.ApprovalRecord{}); none.SummaryOnly() != none {
		t.Fatal("a record without a preview is copied for nothing")
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
