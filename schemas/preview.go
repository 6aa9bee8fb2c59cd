package schemas

import (
	"fmt"
	"strings"
	"unicode/utf8"
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
// not recognise is context.
func DiffLines(text string) []DiffLine {
	text = strings.TrimSuffix(text, "\n")
	if text == "" {
		return nil
	}
	lines := strings.Split(text, "\n")
	out := make([]DiffLine, 0, len(lines))
	header := true // "--- "/"+++ " are headers only before the first hunk
	for _, l := range lines {
		op := "ctx"
		switch {
		case header && (strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "+++ ")):
			op = "file"
		case strings.HasPrefix(l, "@@"):
			op, header = "hunk", false
		case strings.HasPrefix(l, "+"):
			op = "add"
		case strings.HasPrefix(l, "-"):
			op = "del"
		}
		out = append(out, DiffLine{Op: op, Text: l})
	}
	return out
}

// Summary is the preview in a few words, the same on every surface that
// has no room for the whole (chat prompts, lists): "+3 -1 lines", "new
// file, 4 lines", "no change", "preview failed: <reason>", "preview timed
// out". It is "" for no preview or a tool that offers none. The words are
// the tool's for a text preview's first line, cut to 80 bytes; reason and
// text are untrusted (a surface escapes them as it escapes the arguments).
func (p *ApprovalPreview) Summary() string {
	if p == nil {
		return ""
	}
	switch p.Status {
	case PreviewFailed:
		return "preview failed: " + p.Reason
	case PreviewTimedOut:
		return "preview timed out"
	case PreviewOK:
	default:
		return ""
	}
	switch p.Kind {
	case PreviewKindDiff:
		add, del := 0, 0
		for _, l := range DiffLines(p.Text) {
			switch l.Op {
			case "add":
				add++
			case "del":
				del++
			}
		}
		return fmt.Sprintf("+%d -%d lines", add, del)
	case PreviewKindNewFile:
		if n := lineCount(p.Text); n != 1 {
			return fmt.Sprintf("new file, %d lines", n)
		}
		return "new file, 1 line"
	case PreviewKindUnchanged:
		return "no change"
	}
	first, _, _ := strings.Cut(p.Text, "\n")
	if len(first) > 80 {
		n := 80
		for n > 0 && !utf8.RuneStart(first[n]) {
			n--
		}
		first = first[:n] + "…"
	}
	return first
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
