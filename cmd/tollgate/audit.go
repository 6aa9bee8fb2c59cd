package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-dev/tollgate/audit"
	"github.com/tollgate-dev/tollgate/schemas"
)

var auditCmd = &command{
	name:    "audit",
	summary: "the timeline of decisions and executions from the streams: turns, approvals, decisions, rejections, batch states, redrives, results",
	example: "tollgate audit --principal cli:alice --since 2h",
	run:     cmdAudit,
}

// cmdAudit prints the timeline of decisions and executions that the
// streams hold, oldest first: accepted turns, approvals requested, decided
// (expiry and abandon included) and refused decisions, each batch's moves
// from state to state (its turn's log: awaiting its approvals, started
// once they are all decided, ...), redrives, each call's result and the
// turn outcomes. A turn of an earlier version has no log: its redrive
// started events say when its calls were freed instead.
func cmdAudit(cmd *command, args []string) int { return runAudit(cmd, args, os.Stdout) }

func runAudit(cmd *command, args []string, out io.Writer) int {
	fs := cmd.flags()
	var c client
	c.register(fs, 10*time.Minute) // a day of history can take a while
	var q audit.Query
	fs.StringVar(&q.Turn, "turn", "", "only events of this turn")
	fs.StringVar(&q.Approval, "approval", "", "only events of this approval: requested, decisions, rejections, its call's result")
	fs.StringVar(&q.Principal, "principal", "", "only events where this principal (cli:alice) is the requester, a decider or a refused decider")
	since := fs.String("since", "24h", "only events stored at or after this time: RFC 3339, or a duration ago")
	until := fs.String("until", "", "only events stored at or before this time: RFC 3339, or a duration ago")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	switch {
	case len(pos) > 0:
		return cmd.usageError("no arguments expected, got %q", pos)
	case q.Turn != "" && !schemas.ValidKey(q.Turn):
		return cmd.usageError("--turn %q is not a turn id", q.Turn)
	case q.Approval != "" && (!schemas.ValidKey(q.Approval) || schemas.TurnIDOfApproval(q.Approval) == ""):
		return cmd.usageError("--approval %q is not an approval id", q.Approval)
	case q.Approval != "" && q.Turn != "" && schemas.TurnIDOfApproval(q.Approval) != q.Turn:
		return cmd.usageError("approval %s is not of turn %s", q.Approval, q.Turn)
	}
	var err error
	if q.Since, err = parseWhen(*since); err != nil {
		return fail("audit: --since: %v", err)
	}
	if q.Until, err = parseWhen(*until); err != nil {
		return fail("audit: --until: %v", err)
	}
	if !q.Until.IsZero() && q.Until.Before(q.Since) {
		return fail("audit: --until %s is before --since %s", q.Until.Format(time.RFC3339), q.Since.Format(time.RFC3339))
	}
	if err := c.connect(); err != nil {
		return c.fail("audit", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	events, err := audit.Read(ctx, c.js, q, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return c.fail("audit", err)
	}
	if c.json {
		enc := json.NewEncoder(out)
		enc.SetEscapeHTML(false)
		for _, e := range events {
			_ = enc.Encode(e)
		}
		return 0
	}
	printAudit(out, events)
	return 0
}

// printAudit writes events as a table, one line each.
func printAudit(w io.Writer, events []audit.Event) {
	if len(events) == 0 {
		fmt.Fprintln(w, "no events (widen --since, or check the filters)")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tEVENT\tTURN\tAPPROVAL / CALL\tWHO\tDETAIL")
	for _, e := range events {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Format("2006-01-02T15:04:05.000Z07:00"), e.Kind,
			orDash(e.TurnID), auditSubject(e), auditWho(e), auditDetail(e))
	}
	_ = tw.Flush()
}

// auditSubject is the approval an event is about, or for a result its call.
func auditSubject(e audit.Event) string {
	if e.Kind == audit.Result {
		return e.CallID
	}
	return orDash(e.ApprovalID)
}

// auditWho is the principal an event is about: who acted, else whose turn.
func auditWho(e audit.Event) string {
	switch {
	case e.Kind == audit.Result && len(e.DecidedBy) > 0:
		return strings.Join(e.DecidedBy, ",")
	case e.Principal != "":
		return e.Principal
	}
	return orDash(e.Requester)
}

// auditDetail is the rest of an event in a few words.
func auditDetail(e audit.Event) string {
	var b strings.Builder
	coded := func() {
		if e.Code != "" {
			fmt.Fprintf(&b, " %s", e.Code)
		}
		if e.Reason != "" {
			fmt.Fprintf(&b, ": %s", clip(strings.ReplaceAll(e.Reason, "\n", " "), 80))
		}
	}
	switch e.Kind {
	case audit.Accepted:
		fmt.Fprintf(&b, "%s %s, audience %s, %d calls", e.Transport, e.Channel, e.Audience, e.Calls)
		if e.Origin != "" {
			fmt.Fprintf(&b, ", follow-up of %s", e.Origin)
		}
	case audit.Requested:
		expires := "never"
		if e.ExpiresAt != nil {
			expires = e.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(&b, "%s %s, options %s, expires %s", e.Tool, e.ArgsDigest, strings.Join(e.Options, "|"), expires)
		if e.Quorum > 1 {
			fmt.Fprintf(&b, ", quorum %d", e.Quorum)
		}
	case audit.Decided:
		b.WriteString(e.Status)
		if e.Option != "" {
			fmt.Fprintf(&b, " (%s, assurance %d)", e.Option, e.Assurance)
		}
		if len(e.Votes) > 0 {
			fmt.Fprintf(&b, ", votes %s", strings.Join(e.Votes, ","))
		}
		b.WriteString(notePart(e.Note))
	case audit.Rejected:
		b.WriteString("refused")
		coded()
	case audit.Batch:
		b.WriteString(e.Status)
		coded()
		switch {
		case e.Status == string(schemas.BatchAwaiting):
			fmt.Fprintf(&b, ", %d approvals", e.Pending)
		case e.Status == string(schemas.BatchCompleted) || e.Status == string(schemas.BatchFailed):
			fmt.Fprintf(&b, ", %d results", e.Results)
		}
	case audit.Redrive:
		b.WriteString(e.Status)
		coded()
		fmt.Fprintf(&b, " (%s)", cmp.Or(e.Trigger, "no trigger"))
	case audit.Result:
		fmt.Fprintf(&b, "%s %s", e.Tool, e.Status)
		coded()
		if e.ApprovalStatus != "" {
			fmt.Fprintf(&b, ", approval %s", e.ApprovalStatus)
		}
	case audit.Outcome:
		b.WriteString(e.Status)
		coded()
		fmt.Fprintf(&b, ", %d results", e.Results)
	}
	return b.String()
}
