package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

var pendingCmd = &command{
	name:    "pending",
	summary: "list pending approvals, oldest first (tollgate show APPROVAL for one in full)",
	example: "tollgate pending --session demo",
	run:     cmdPending,
}

// cmdPending lists approval records in status pending, oldest first. It
// reads every record version the stages read (see client.store). With
// --wait it polls until at least one is pending, else says so on stderr
// and exits 3 (after printing the empty list).
func cmdPending(cmd *command, args []string) (code int) {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	session := fs.String("session", "", "only this session")
	wait := fs.Duration("wait", 0, "wait up to this long for a pending approval to list (exit status 3 if none comes)")
	ids := fs.Bool("ids", false, "print only the approval ids, one per line (for scripts: tollgate show $(tollgate pending --ids))")
	if exit, ok := c.startNoArgs(cmd, fs, args); !ok {
		return exit
	}
	defer c.close()
	if *wait+5*time.Second > c.timeout {
		c.timeout = *wait + 5*time.Second
	}
	ctx, cancel := c.ctx()
	defer cancel()
	st, err := c.store(ctx)
	if err != nil {
		return c.fail("pending", err)
	}
	deadline := time.Now().Add(*wait)
	var recs []*schemas.ApprovalRecord
	for {
		if recs, err = listPending(ctx, st, *session); err != nil {
			return c.fail("pending", err)
		}
		if len(recs) > 0 || !time.Now().Before(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(recs) == 0 && *wait > 0 {
		fmt.Fprintf(os.Stderr, "tollgate pending: timed out after %v: no pending approval\n", *wait)
		defer func() { code = exitTimedOut }()
	}
	sort.SliceStable(recs, func(a, b int) bool { return recs[a].RequestedAt.Before(recs[b].RequestedAt) })
	if c.json {
		out := make([]any, 0, len(recs))
		for _, r := range recs {
			out = append(out, recordMap(r))
		}
		printJSON(out)
		return 0
	}
	if *ids {
		for _, r := range recs {
			fmt.Println(r.ApprovalID)
		}
		return 0
	}
	if len(recs) == 0 {
		fmt.Println("no pending approvals")
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "APPROVAL\tSESSION\tREQUESTER\tTOOL\tARGS\tOPTIONS\tAGE\tEXPIRES")
	var flagged []string
	for _, r := range recs {
		args, f := reveal.JSON(r.Args)
		who, g := reveal.String(requester(r.Context))
		if f || g {
			flagged = append(flagged, r.ApprovalID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ApprovalID, reveal.Must(r.SessionID), who, r.Tool,
			clip(args, 60), strings.Join(r.Options, ","), time.Since(r.RequestedAt).Round(time.Second), expiry(r.ExpiresAt, time.Now()))
	}
	_ = tw.Flush()
	for _, id := range flagged {
		fmt.Printf("%s:\n%s\n", id, warnLine)
	}
	// What each grant option would cover, and for how long: a decider must
	// see it before choosing one.
	for _, r := range recs {
		for _, o := range r.Grants {
			fmt.Printf("%s %s: %s\n", r.ApprovalID, o.Option, reveal.Must(o.Summary))
		}
	}
	fmt.Println("\n'tollgate show APPROVAL' shows one in full.")
	return 0
}

// requester names the requester of tc, marking a context restored from a
// legacy record.
func requester(tc *schemas.TurnContext) string {
	switch {
	case tc == nil:
		return "?"
	case tc.LegacyRestored:
		return tc.Requester.Principal + " (legacy)"
	}
	return tc.Requester.Principal
}

// expiry is when an approval expires, relative to now.
func expiry(at, now time.Time) string {
	switch {
	case at.IsZero():
		return "never"
	case !at.After(now):
		return "expired " + now.Sub(at).Round(time.Second).String() + " ago"
	}
	return "in " + at.Sub(now).Round(time.Second).String()
}

// listPending returns the pending approvals (of session, when not ""), in
// no particular order.
func listPending(ctx context.Context, st *store.Store, session string) ([]*schemas.ApprovalRecord, error) {
	var recs []*schemas.ApprovalRecord
	// One watcher streams the latest value of every key (a snapshot), instead
	// of a Get round trip per key.
	w, err := st.Approvals.KV.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
snapshot:
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				break snapshot // every current value has been delivered
			}
			rec, err := st.Approvals.DecodeValue(e.Value())
			if err != nil {
				fmt.Fprintf(os.Stderr, "tollgate: skipping %s: %v\n", e.Key(), err)
				continue
			}
			if rec.Status != schemas.ApprovalPending || (session != "" && rec.SessionID != session) {
				continue
			}
			recs = append(recs, rec)
		}
	}
	return recs, nil
}
