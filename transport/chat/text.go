package chat

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Truncate cuts s to at most n bytes on a rune boundary; cut reports
// whether it did.
func Truncate(s string, n int) (_ string, cut bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// Fold is Truncate to n bytes with " …" after a cut.
func Fold(s string, n int) string {
	if s, cut := Truncate(s, n); cut {
		return s + " …"
	}
	return s
}

// StatusWord is an approval status as a prompt's heading shows it.
func StatusWord(s schemas.ApprovalStatus) string {
	switch s {
	case schemas.ApprovalApproved:
		return "Approved"
	case schemas.ApprovalDenied:
		return "Denied"
	case schemas.ApprovalExpired:
		return "Expired"
	case schemas.ApprovalAbandoned:
		return "Abandoned"
	}
	return string(s)
}

// Expiry is when an approval expires as a prompt shows it: RFC 3339 UTC,
// or "never".
func Expiry(rec *schemas.ApprovalRecord) string {
	if rec.ExpiresAt.IsZero() {
		return "never"
	}
	return rec.ExpiresAt.UTC().Format(time.RFC3339)
}

// Decided is who closed an approval and when, as a closed prompt shows
// it: d's principal ("tollgate" when none, as for an expiry by the
// approver) and d's time, else at; and d's note ("" for none).
func Decided(d *schemas.DecisionInfo, at time.Time) (who string, when time.Time, note string) {
	who, when = "tollgate", at
	if d != nil {
		if d.Principal != "" {
			who = d.Principal
		}
		if !d.DecidedAt.IsZero() {
			when = d.DecidedAt
		}
		note = d.Note
	}
	return who, when, note
}

// Markup is how a platform's renderer writes the parts of a message
// (OutcomeText): each function makes its text inert in the platform's
// markup.
type Markup struct {
	// Bold is a heading.
	Bold func(string) string
	// Name is a tool's name, inline.
	Name func(string) string
	// Block is a tool's output or reason, with what separates it from
	// the line before (a code block).
	Block func(string) string
	// BlockMax is how many bytes of an output are shown (folded beyond).
	BlockMax int
}

// OutcomeText renders a turn's results: a heading with the turn, its
// state and code, then a line per result with its tool, status, code and
// output (or reason), folded at m.BlockMax.
func OutcomeText(o *schemas.TurnOutcome, m Markup) string {
	var b strings.Builder
	head := fmt.Sprintf("Turn %s %s", o.TurnID, o.State)
	b.WriteString(m.Bold(head))
	if o.Code != "" {
		fmt.Fprintf(&b, " (%s)", o.Code)
	}
	for _, r := range o.Results {
		fmt.Fprintf(&b, "\n• %s: %s", m.Name(r.Tool), r.Status)
		if r.Code != "" {
			fmt.Fprintf(&b, " (%s)", r.Code)
		}
		out := r.Output
		if out == "" {
			out = r.Reason
		}
		if out != "" {
			b.WriteString(m.Block(Fold(out, m.BlockMax)))
		}
	}
	return b.String()
}
