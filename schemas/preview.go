package schemas

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Preview kinds (ApprovalPreview.Kind with status ok; tools.Preview.Kind).
const (
	PreviewKindDiff      = "diff"      // Text is a unified diff
	PreviewKindNewFile   = "new_file"  // Text is the content of a file the call creates
	PreviewKindUnchanged = "unchanged" // the call would change nothing
	PreviewKindText      = "text"      // Text describes the effect in the tool's words
)

// DiffLine is one line of a diff preview as the surfaces show it.
type DiffLine struct {
	// Op is "file" (a "--- " or "+++ " header), "hunk" ("@@ ... @@"),
	// "add" ("+"), "del" ("-") or "ctx" (anything else).
	Op   string
	Text string // the line without its newline, its sign included
}

// DiffLines splits a diff preview's text (PreviewDiff: a unified diff) into
// its lines, each with what it does. It accepts any text: a line it does
// not recognise is context. Only the lines a hunk header ("@@ -a,n +b,m @@")
// announces are changes: a "+" or "-" line before the first hunk (a
// header that forged lines) or beyond the hunk's counts is context, so that
// nothing but real hunk lines is ever shown or counted as added or removed.
func DiffLines(text string) []DiffLine {
	text = strings.TrimSuffix(text, "\n")
	if text == "" {
		return nil
	}
	lines := strings.Split(text, "\n")
	out := make([]DiffLine, 0, len(lines))
	header := true           // "--- "/"+++ " are headers only before the first hunk
	oldLeft, newLeft := 0, 0 // lines the current hunk still announces
	for _, l := range lines {
		op := "ctx"
		switch {
		case strings.HasPrefix(l, "@@"):
			op, header = "hunk", false
			oldLeft, newLeft = hunkSizes(l)
		case header:
			if strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "+++ ") {
				op = "file"
			}
		case strings.HasPrefix(l, "+") && newLeft > 0:
			op, newLeft = "add", newLeft-1
		case strings.HasPrefix(l, "-") && oldLeft > 0:
			op, oldLeft = "del", oldLeft-1
		case strings.HasPrefix(l, " ") && oldLeft > 0 && newLeft > 0:
			oldLeft, newLeft = oldLeft-1, newLeft-1
		}
		out = append(out, DiffLine{Op: op, Text: l})
	}
	return out
}

// hunkHeader is a unified diff's hunk header; a missing count is 1.
var hunkHeader = regexp.MustCompile(`^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@`)

// hunkSizes is how many old and new lines hunk header l announces; 0, 0 for
// a header that is not one.
func hunkSizes(l string) (old, new int) {
	m := hunkHeader.FindStringSubmatch(l)
	if m == nil {
		return 0, 0
	}
	size := func(s string) int {
		if s == "" {
			return 1
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0
		}
		return n
	}
	return size(m[1]), size(m[2])
}

// Counts is what the preview's summary says in numbers: for a diff, its
// added and removed lines (real hunk lines only: DiffLines); for a new file
// or a text, its lines. A summary-only preview (Redacted) has them as
// fields; a whole one counts them from Text.
func (p *ApprovalPreview) Counts() (added, removed, lines int) {
	switch {
	case p == nil:
		return 0, 0, 0
	case p.Redacted:
		return p.Added, p.Removed, p.Lines
	case p.Kind == PreviewKindDiff:
		for _, l := range DiffLines(p.Text) {
			switch l.Op {
			case "add":
				added++
			case "del":
				removed++
			}
		}
		return added, removed, 0
	case p.Kind == PreviewKindNewFile, p.Kind == PreviewKindText:
		return 0, 0, lineCount(p.Text)
	}
	return 0, 0, 0
}

// Summary is the preview in a few words, the same on every surface that
// has no room for the whole (chat prompts, lists) and on every surface that
// may not show the whole (SummaryOnly): "+3 -1 lines", "new file, 4
// lines", "no change", "description, 2 lines", "preview failed", "preview
// timed out". It is "" for no preview or a tool that offers none. It says
// nothing of the content: no line of the text, no reason (docs/security.md
// rule 17), only the kind, the status and the counts.
func (p *ApprovalPreview) Summary() string {
	if p == nil {
		return ""
	}
	switch p.Status {
	case PreviewFailed:
		return "preview failed"
	case PreviewTimedOut:
		return "preview timed out"
	case PreviewOK:
	default:
		return ""
	}
	added, removed, lines := p.Counts()
	switch p.Kind {
	case PreviewKindDiff:
		return fmt.Sprintf("+%d -%d lines", added, removed)
	case PreviewKindNewFile:
		return "new file, " + plural(lines, "line")
	case PreviewKindUnchanged:
		return "no change"
	}
	return "description, " + plural(lines, "line")
}

// SummaryOnly is p as a surface shows it to anyone who may not decide the
// approval (docs/security.md rule 17): its status, kind, counts (Counts),
// time and truncation, with nothing of the content (no Text, no Reason:
// a failure's reason may quote it), marked Redacted. It is the one place
// that decides what a preview discloses. A preview with no text and no
// reason (unsupported, unchanged) has nothing to leave out and is returned
// as it is, as is nil.
func (p *ApprovalPreview) SummaryOnly() *ApprovalPreview {
	if p == nil || p.Redacted || (p.Text == "" && p.Reason == "") {
		return p // nothing of the content to leave out
	}
	added, removed, lines := p.Counts()
	return &ApprovalPreview{Status: p.Status, Kind: p.Kind, Truncated: p.Truncated, At: p.At,
		Redacted: true, Added: added, Removed: removed, Lines: lines}
}

// SummaryOnly is a shallow copy of a with its preview summary-only
// (ApprovalPreview.SummaryOnly): the record as it is published on
// tollgate.event.approval.requested and shown to anyone who may not decide
// it. a itself is not changed; a record without a preview is returned as
// it is.
func (a *ApprovalRecord) SummaryOnly() *ApprovalRecord {
	if a == nil {
		return nil
	}
	p := a.Preview.SummaryOnly()
	if p == a.Preview {
		return a
	}
	c := *a
	c.Preview = p
	return &c
}

// plural is "1 line" or "n lines".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// lineCount is the number of lines of s (a last line without a newline
// counts).
func lineCount(s string) int {
	n := strings.Count(s, "\n")
	if s != "" && !strings.HasSuffix(s, "\n") {
		n++
	}
	return n
}
