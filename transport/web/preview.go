package web

import (
	"time"

	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

// previewView is an approval's preview as the "preview" template
// (templates/preview.html) shows it next to the arguments. Every text in it
// went through reveal; the template escapes it like any other text.
type previewView struct {
	Status, Kind string
	At           time.Time
	Summary      string
	Lines        []schemas.DiffLine // a diff, line by line
	Text         string             // a new file's content, or a tool's words
	Reason       string             // why there is none (failed, timed out)
	Truncated    bool
	Warning      string // reveal.Warning when a text held a character reveal escapes
}

// previewOf is the view of p, or nil (nothing shown) when there is no
// preview or the tool offers none.
func previewOf(p *schemas.ApprovalPreview) *previewView {
	if p == nil || p.Status == schemas.PreviewUnsupported || p.Status == "" {
		return nil
	}
	v := &previewView{Status: p.Status, Kind: p.Kind, At: p.At, Truncated: p.Truncated}
	flagged := false
	show := func(s string) string {
		out, f := reveal.String(s)
		flagged = flagged || f
		return out
	}
	v.Summary, v.Reason = show(p.Summary()), show(p.Reason)
	if p.Status == schemas.PreviewOK {
		if p.Kind == schemas.PreviewKindDiff {
			v.Lines = schemas.DiffLines(p.Text)
			for i := range v.Lines {
				v.Lines[i].Text = show(v.Lines[i].Text)
			}
		} else {
			v.Text = show(p.Text)
		}
	}
	if flagged {
		v.Warning = reveal.Warning
	}
	return v
}
