package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

var showCmd = &command{
	name:    "show",
	args:    "APPROVAL_ID",
	summary: "show everything a decider needs about one approval: the whole call, requester, channel, options, expiry, votes",
	example: "tollgate show a-0123456789abcdef0123-0",
	run:     cmdShow,
}

// cmdShow prints one approval record in full, read as the stages read it
// (a legacy record through the compatibility path).
func cmdShow(cmd *command, args []string) int {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) != 1 {
		return cmd.usageError("want one approval id")
	}
	id := pos[0]
	if !schemas.ValidKey(id) {
		return fail("show: %q is not an approval id", id)
	}
	if err := c.connect(); err != nil {
		return c.fail("show", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	st, err := c.store(ctx)
	if err != nil {
		return c.fail("show", err)
	}
	a, _, err := st.Approvals.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return fail("show: no approval %s (see 'tollgate pending')", id)
	}
	if err != nil {
		return c.fail("show", err)
	}
	if c.json {
		printJSON(recordMap(a))
		return 0
	}
	printApproval(os.Stdout, a, time.Now())
	return 0
}

// noteText is a decider's note for a terminal: its hidden and control
// characters escaped (reveal.Must), line breaks as spaces, clipped to n
// bytes when n > 0. A note is data, shown, never obeyed.
func noteText(note string, n int) string {
	s := reveal.Must(strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(note))
	if n > 0 {
		s = clip(s, n)
	}
	return s
}

// notePart is `, note "…"` for a note, "" for none.
func notePart(note string) string {
	if note == "" {
		return ""
	}
	return `, note "` + noteText(note, 80) + `"`
}

// printApproval writes a in full: nothing is clipped.
func printApproval(w io.Writer, a *schemas.ApprovalRecord, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("approval", "%s (%s)", a.ApprovalID, a.Status)
	row("turn", "%s  call %s  session %s", a.TurnID, a.CallID, reveal.Must(a.SessionID))
	row("tool", "%s", a.Tool)
	row("digest", "%s", a.ArgsDigest)
	args, flagged := reveal.JSON(prettyArgs(a.Args))
	if tc := a.Context; tc != nil {
		r := tc.Requester
		who, f := reveal.String(requester(tc))
		display, g := reveal.String(r.Display)
		flagged = flagged || f || g
		verified := "not verified"
		if r.Verified {
			verified = "verified"
		}
		row("requester", "%s  display \"%s\"  %s, %s", who, display, r.Kind, verified)
		thread := ""
		if tc.Channel.Thread != "" {
			thread = "  thread " + reveal.Must(tc.Channel.Thread)
		}
		row("transport", "%s  trust boundary %s  interactive %v", tc.Transport, tc.TrustBoundary, tc.Interactive)
		row("channel", "%s %s%s  audience %s", tc.Channel.Kind, reveal.Must(tc.Channel.ID), thread, tc.Audience)
	} else {
		row("requester", "? (no TurnContext: the stages refuse this record)")
	}
	row("options", "%s", strings.Join(a.Options, ", "))
	for _, o := range a.Grants {
		row("  "+o.Option, "%s", reveal.Must(o.Summary))
	}
	row("policy", "%s", a.PolicyVersion)
	row("requested", "%s (%s ago)", a.RequestedAt.UTC().Format(time.RFC3339), now.Sub(a.RequestedAt).Round(time.Second))
	if a.ExpiresAt.IsZero() {
		row("expires", "never")
	} else {
		row("expires", "%s (%s)", a.ExpiresAt.UTC().Format(time.RFC3339), expiry(a.ExpiresAt, now))
	}
	if a.Quorum > 1 || len(a.Votes) > 0 {
		row("quorum", "%d distinct approvals, %d so far", max(a.Quorum, 1), len(a.Votes))
	}
	for _, v := range a.Votes {
		row("vote", "%s %s at %s (decision %s)%s", reveal.Must(v.Principal), v.Option, v.DecidedAt.UTC().Format(time.RFC3339), v.DecisionID, notePart(v.Note))
	}
	if d := a.Decision; d != nil {
		row("decision", "%s by %s at %s (decision %s)", d.Option, reveal.Must(d.Principal), d.DecidedAt.UTC().Format(time.RFC3339), d.DecisionID)
		if g := d.Grant; g != nil {
			row("by grant", "%s: %s", g.GrantID, reveal.Must(g.Summary))
		}
		if d.Note != "" {
			row("note", "%s", noteText(d.Note, 0))
		}
	}
	_ = tw.Flush()
	if flagged {
		fmt.Fprintln(w, warnLine)
	}
	fmt.Fprintf(w, "arguments:\n%s\n", args)
	printPreview(w, a.Preview)
}

// printPreview writes what the call would change (the record's preview),
// escaped like the arguments; nothing for none or a tool that offers none.
func printPreview(w io.Writer, p *schemas.ApprovalPreview) {
	if p == nil || p.Status == "" || p.Status == schemas.PreviewUnsupported {
		return
	}
	summary := p.Summary() // no content: nothing to escape
	text, f := reveal.String(p.Text)
	reason, g := reveal.String(p.Reason)
	if reason != "" {
		summary += ": " + reason
	}
	fmt.Fprintf(w, "preview (as of %s; it may change before the call runs): %s\n", p.At.UTC().Format(time.RFC3339), summary)
	if f || g {
		fmt.Fprintln(w, warnLine)
	}
	if p.Status == schemas.PreviewOK && text != "" {
		fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(strings.TrimSuffix(text, "\n"), "\n", "\n  "))
	}
	if p.Truncated {
		fmt.Fprintln(w, "  (cut to 16 KiB)")
	}
}

// prettyArgs indents JSON arguments for reading; anything else is returned
// as it is.
func prettyArgs(args string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(args), "  ", "  "); err != nil {
		return "  " + args
	}
	return "  " + b.String()
}
