package tools

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Previewer is implemented by a tool that can tell, without running a call
// and without changing anything, what the call would change: write_file's
// diff of the file as it is against what the call would write. Preview must
// be read-only (a preview is not a call: it may never have an effect, and
// it runs for a call nobody approved yet), must honour ctx's deadline, and
// returns what it found as text. The text is untrusted data, like the
// call's arguments: whoever shows it escapes it as it escapes them.
type Previewer interface {
	Preview(ctx context.Context, c Call) (Preview, error)
}

// Preview is what a call would change.
type Preview struct {
	// Kind: PreviewDiff (Text is a unified diff of the target as it is
	// against what the call would leave), PreviewNewFile (the target does
	// not exist; Text is what the call would create), PreviewUnchanged (the
	// call would change nothing; Text is ""), PreviewText (Text describes
	// the effect in the tool's own words).
	Kind string `json:"kind"`
	Text string `json:"text,omitempty"`
}

// CheckKind reports an error unless p's Kind is one of the preview kinds:
// how a preview from outside the process (a tool service, an MCP server)
// is checked before it is kept.
func (p Preview) CheckKind() error {
	switch p.Kind {
	case PreviewDiff, PreviewNewFile, PreviewUnchanged, PreviewText:
		return nil
	}
	return fmt.Errorf("preview kind %q, want diff, new_file, unchanged or text", p.Kind)
}

// Preview kinds.
const (
	PreviewDiff      = schemas.PreviewKindDiff
	PreviewNewFile   = schemas.PreviewKindNewFile
	PreviewUnchanged = schemas.PreviewKindUnchanged
	PreviewText      = schemas.PreviewKindText
)

// PreviewResult is the outcome of PreviewCall: Status PreviewOK with a
// Preview, or why there is none. No status blocks or changes a decision:
// the approval is bound to the call's arguments (their digest), never to a
// preview.
type PreviewResult struct {
	Status  string `json:"status"`
	Preview        // Kind and Text, with Status PreviewOK
	Reason  string `json:"reason,omitempty"`
	// Truncated: Text was cut to MaxPreviewBytes.
	Truncated bool `json:"truncated,omitempty"`
}

// Preview statuses.
const (
	PreviewOK          = schemas.PreviewOK
	PreviewUnsupported = schemas.PreviewUnsupported // the tool offers no preview
	PreviewFailed      = schemas.PreviewFailed      // the tool's preview failed (Reason)
	PreviewTimedOut    = schemas.PreviewTimedOut    // no answer within the deadline
)

// DefaultPreviewDeadline is PreviewCall's deadline when it is given none.
const DefaultPreviewDeadline = 2 * time.Second

// MaxPreviewBytes caps a preview's text; longer text is cut at a rune
// boundary and marked Truncated.
const MaxPreviewBytes = schemas.MaxPreviewBytes

// PreviewCall asks t for a preview of call c, and returns within deadline
// (DefaultPreviewDeadline when <= 0) whatever t does: a tool that does not
// answer in time gives PreviewTimedOut, even one that ignores its context;
// a tool that is not a Previewer gives PreviewUnsupported; an error gives
// PreviewFailed with its text. It never returns an error: a missing preview
// only says so.
func PreviewCall(ctx context.Context, t Tool, c Call, deadline time.Duration) PreviewResult {
	return PreviewCallLimited(ctx, t, c, deadline, nil)
}

// PreviewCallLimited is PreviewCall with at most cap(slots) previews
// running at once among those given the same slots (nil: no limit). The
// wait for a slot counts against the deadline: when none frees in time the
// result is PreviewTimedOut, and the tool is not asked. A slot is held
// until the tool's Preview returns, even past the deadline, so that a tool
// that ignores its context never has more than cap(slots) previews
// running.
func PreviewCallLimited(ctx context.Context, t Tool, c Call, deadline time.Duration, slots chan struct{}) PreviewResult {
	p, ok := t.(Previewer)
	if !ok {
		return PreviewResult{Status: PreviewUnsupported}
	}
	if deadline <= 0 {
		deadline = DefaultPreviewDeadline
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	timedOut := PreviewResult{Status: PreviewTimedOut, Reason: fmt.Sprintf("no preview within %s", deadline)}
	if slots != nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return timedOut
		}
	}
	type answer struct {
		p   Preview
		err error
	}
	done := make(chan answer, 1) // a late answer is dropped, never blocks
	go func() {
		if slots != nil {
			defer func() { <-slots }()
		}
		pv, err := p.Preview(ctx, c)
		done <- answer{pv, err}
	}()
	select {
	case a := <-done:
		switch {
		case errors.Is(a.err, context.DeadlineExceeded):
			return timedOut
		case a.err != nil:
			return PreviewResult{Status: PreviewFailed, Reason: clipText(a.err.Error(), schemas.MaxPreviewReasonBytes)}
		}
		r := PreviewResult{Status: PreviewOK, Preview: a.p}
		if len(r.Text) > MaxPreviewBytes {
			r.Text, r.Truncated = clipText(r.Text, MaxPreviewBytes), true
		}
		return r
	case <-ctx.Done():
		return timedOut
	}
}

// Record is r as an approval record keeps it, as of at.
func (r PreviewResult) Record(at time.Time) *schemas.ApprovalPreview {
	return &schemas.ApprovalPreview{Status: r.Status, Kind: r.Kind, Text: r.Text, Reason: r.Reason,
		Truncated: r.Truncated, At: at}
}

// clipText cuts s to at most n bytes at a rune boundary.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Preview implements Previewer: the diff of the file at the call's path as
// it is now against the content the call would write ("new_file" with the
// content when there is no file, "unchanged" when they are equal). It only
// opens the file for reading, inside the sandbox (os.Root: a path that
// leaves it fails as the call would), and creates nothing. A file or a
// content of more than 2,000 lines is a "text" preview giving both sizes.
func (w *WriteFile) Preview(_ context.Context, c Call) (Preview, error) {
	a, err := writeFileArgs(c.Args)
	if err != nil {
		return Preview{}, err
	}
	root, err := w.sandbox(nil)
	if err != nil {
		return Preview{}, fmt.Errorf("write_file: open sandbox: %w", err)
	}
	old, err := root.ReadFile(a.Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Preview{Kind: PreviewNewFile, Text: a.Content}, nil
	case err != nil:
		return Preview{}, fmt.Errorf("write_file: read %s: %w", a.Path, err)
	case string(old) == a.Content:
		return Preview{Kind: PreviewUnchanged}, nil
	}
	d, ok := LineDiff(string(old), a.Content)
	if !ok {
		return Preview{Kind: PreviewText, Text: fmt.Sprintf("replaces %s (%d bytes) with %d bytes; too long to diff", a.Path, len(old), len(a.Content))}, nil
	}
	if d == "" { // they differ only in a final newline
		d = "(only the final newline differs)\n"
	}
	h := diffHeaderPath(a.Path)
	return Preview{Kind: PreviewDiff, Text: "--- " + h + "\n+++ " + h + "\n" + d}, nil
}

// diffHeaderPath is path as a diff's "--- "/"+++ " header names it: as it
// is when it holds only printable characters, else quoted as a Go string
// (as git quotes such a name), so that a path with a newline or another
// control character can never add a line to the diff (a forged "-" or "+"
// line, or a hunk) nor change its summary. Quotes and backslashes are
// quoted too, so that a quoted name is never ambiguous.
func diffHeaderPath(path string) string {
	if strings.IndexFunc(path, func(r rune) bool { return !unicode.IsPrint(r) || r == '"' || r == '\\' }) < 0 {
		return path
	}
	return strconv.Quote(path)
}
