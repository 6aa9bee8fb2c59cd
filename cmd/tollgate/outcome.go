package main

import (
	"context"
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

var outcomeCmd = &command{
	name:    "outcome",
	args:    "TURN_ID",
	summary: "show a turn's state, who decided each call's approval, and the results",
	example: "tollgate outcome t-0123456789abcdef0123 --wait 30s",
	run:     cmdOutcome,
}

// exitTimedOut is outcome's exit status when the turn is unknown, or when
// --wait ran out before the turn was terminal.
const exitTimedOut = 3

// cmdOutcome prints a turn's batch state, the decision on each call's
// approval and the tool results. With --wait it polls until the turn is
// terminal; if it is not by then, it says so on stderr and exits 3.
func cmdOutcome(cmd *command, args []string) int {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	wait := fs.Duration("wait", 0, "wait up to this long for a terminal state (exit status 3 if it is not reached)")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) != 1 || !schemas.ValidKey(pos[0]) {
		return cmd.usageError("want one turn id")
	}
	turn := pos[0]
	if *wait+5*time.Second > c.timeout {
		c.timeout = *wait + 5*time.Second
	}
	if err := c.connect(); err != nil {
		return c.fail("outcome", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	st, err := c.store(ctx)
	if err != nil {
		return c.fail("outcome", err)
	}
	deadline := time.Now().Add(*wait)
	for {
		b, _, err := st.Batches.Get(ctx, turn)
		switch {
		case errors.Is(err, store.ErrNotFound):
			if time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if c.json {
				printJSON(map[string]any{"turn_id": turn, "state": "unknown"})
			} else {
				fmt.Printf("turn %s: unknown (not yet accepted, or rejected at ingest: see 'tollgate dlq')\n", turn)
			}
			if *wait > 0 {
				fmt.Fprintf(os.Stderr, "tollgate outcome: timed out after %v: turn %s is not known\n", *wait, turn)
			}
			return exitTimedOut
		case err != nil:
			return c.fail("outcome", err)
		}
		if !b.State.Terminal() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		decisions := approvalsOf(ctx, st, b)
		if c.json {
			raw, err := storedBatch(ctx, st, turn, b)
			if err != nil {
				return c.fail("outcome", err)
			}
			out := asMap(raw)
			if m, ok := out.(map[string]any); ok {
				m["decisions"] = decisionsJSON(decisions)
			}
			printJSON(out)
		} else {
			printBatch(os.Stdout, b, decisions)
		}
		if !b.State.Terminal() && *wait > 0 {
			fmt.Fprintf(os.Stderr, "tollgate outcome: timed out after %v: turn %s is still %s\n", *wait, turn, b.State)
			return exitTimedOut
		}
		return 0
	}
}

// storedBatch returns the bytes of turn's batch record as stored, b read
// a moment ago: the last event of the turn's log, or for a batch an
// earlier version wrote (b.Bucketed) its value in tollgate_batches. --json
// prints them whole, fields this build does not know included.
func storedBatch(ctx context.Context, st *store.Store, turn string, b *schemas.BatchRecord) ([]byte, error) {
	if b.Bucketed() {
		e, err := st.Batches.KV.Get(ctx, turn)
		if err != nil {
			return nil, fmt.Errorf("read the batch of %s from %s: %w", turn, st.Batches.KV.Bucket(), err)
		}
		return e.Value(), nil
	}
	ev, err := st.Batches.Log.Log.Last(ctx, turn)
	if err != nil {
		return nil, fmt.Errorf("read the batch of %s from its log: %w", turn, err)
	}
	return ev.Data, nil
}

// approval is one call's approval as read for outcome: the record, or why
// it could not be read.
type approval struct {
	rec *schemas.ApprovalRecord
	err error
}

// approvalsOf reads the approval of every call of b that has one, by id.
func approvalsOf(ctx context.Context, st *store.Store, b *schemas.BatchRecord) map[string]approval {
	out := map[string]approval{}
	for _, id := range b.Approvals {
		if id == "" {
			continue
		}
		a, _, err := st.Approvals.Get(ctx, id)
		out[id] = approval{a, err}
	}
	return out
}

// decisionsJSON is --json's "decisions": approval id -> status, the
// decision (its principal is who decided) and the votes counted so far.
func decisionsJSON(ds map[string]approval) map[string]any {
	out := map[string]any{}
	for id, d := range ds {
		if d.err != nil {
			out[id] = map[string]any{"error": d.err.Error()}
			continue
		}
		out[id] = map[string]any{"status": d.rec.Status, "decision": recordMap(d.rec.Decision), "votes": recordMap(d.rec.Votes)}
	}
	return out
}

// decidedBy says who decided approval id: "cli:alice (approve)", with
// its note ("web:bob (deny, note \"wrong file\")"), its status
// while it has no decision, or "-" for a call that needed none.
func decidedBy(id string, ds map[string]approval) string {
	d, ok := ds[id]
	switch {
	case id == "":
		return "-"
	case !ok || d.err != nil:
		return "?"
	case d.rec.Decision != nil:
		return fmt.Sprintf("%s (%s%s)", reveal.Must(d.rec.Decision.Principal), d.rec.Decision.Option, notePart(d.rec.Decision.Note))
	case len(d.rec.Votes) > 0:
		var who []string
		for _, v := range d.rec.Votes {
			who = append(who, reveal.Must(v.Principal))
		}
		return fmt.Sprintf("%s: votes of %s", d.rec.Status, strings.Join(who, ", "))
	}
	return string(d.rec.Status)
}

// printBatch writes b for a person: the call's fields through reveal
// (a warning line when one holds a character it escapes), tool output and
// reasons through reveal.Controls (no escape sequence reaches the
// terminal).
func printBatch(w io.Writer, b *schemas.BatchRecord, ds map[string]approval) {
	fmt.Fprintf(w, "turn %s  session %s  state %s", b.TurnID, reveal.Must(b.SessionID), b.State)
	if b.Code != "" {
		fmt.Fprintf(w, "  code %s: %s", b.Code, reveal.Controls(b.Reason))
	}
	fmt.Fprintln(w)
	flagged := false
	if b.Context != nil {
		var who string
		who, flagged = reveal.String(requester(b.Context))
		fmt.Fprintf(w, "requester %s  audience %s  channel %s/%s\n", who, b.Context.Audience, b.Context.Channel.Kind, reveal.Must(b.Context.Channel.ID))
	}
	for _, call := range b.Calls {
		if !flagged {
			_, flagged = reveal.JSON(call.Args)
		}
	}
	if flagged {
		fmt.Fprintln(w, warnLine)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tTOOL\tAPPROVAL\tDECIDED BY\tSTATUS\tOUTPUT / REASON")
	for i, call := range b.Calls {
		// A tool's output is clipped; a failure's reason is shown whole
		// (up to maxReasonShown), so that it names what was wrong.
		status, detail, width := "waiting", "", 80
		if r := b.Results[i]; r != nil {
			status, detail = string(r.Status), r.Output
			if r.Code != "" {
				detail, width = string(r.Code)+": "+r.Reason, maxReasonShown
			}
		}
		appr := b.Approvals[i]
		shown := appr
		if shown == "" {
			shown = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", call.CallID, call.Tool, shown, decidedBy(appr, ds), status, clip(reveal.Controls(strings.ReplaceAll(detail, "\n", " ")), width))
	}
	_ = tw.Flush()
}

// maxReasonShown is how much of a failed call's code and reason the human
// output of outcome shows.
const maxReasonShown = 1000
