package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

var grantsCmd = &command{
	name:    "grants",
	args:    "list|show ID|revoke ID [--reason R]",
	summary: "list, show (with what each approved) and revoke standing grants",
	example: "tollgate grants revoke g-0123456789abcdef0123456789abcdef --reason \"no longer needed\"",
	run:     cmdGrants,
}

// cmdGrants is the operator's view of standing grants (docs/protocol.md,
// "Grants"):
//
//	tollgate grants list [--all] [--tool T] [--requester P] [--ids]   live grants (--all: ended ones too; --ids: ids only)
//	tollgate grants show ID                                   one grant in full, and the approvals it decided
//	tollgate grants revoke ID [--reason R] [--by WHO]         revoke it: it decides nothing from now on,
//	                                                          and calls it approved that have not run fail
//	                                                          with GRANT_REVOKED
//
// Every subcommand takes --json. Reading and revoking need the admin
// user (the grants bucket and the grant events).
func cmdGrants(cmd *command, args []string) int {
	sub := ""
	if len(args) > 0 && (args[0] == "list" || args[0] == "show" || args[0] == "revoke") {
		sub, args = args[0], args[1:]
	}
	if len(args) > 0 && args[0] == "help" {
		args = []string{"-h"}
	}
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	all := fs.Bool("all", false, "list: also grants that expired or were revoked")
	ids := fs.Bool("ids", false, "list: print only the grant ids, one per line (for scripts)")
	tool := fs.String("tool", "", "list: only grants of this tool")
	requester := fs.String("requester", "", "list: only grants on this requester's turns (transport:sender_id)")
	reason := fs.String("reason", "", "revoke: why (recorded on the grant and its revoked event)")
	by := fs.String("by", "operator", "revoke: who revokes (recorded)")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	switch {
	case sub == "" && len(pos) > 0:
		return cmd.usageError("unknown subcommand %q", pos[0])
	case sub == "":
		return cmd.usageError("a subcommand is required: list, show or revoke")
	case sub == "list" && len(pos) > 0:
		return cmd.usageError("list takes no arguments, got %q", pos)
	case sub != "list" && len(pos) != 1:
		return cmd.usageError("%s wants one grant id", sub)
	case sub != "list" && !schemas.IsGrantID(pos[0]):
		return fail("grants %s: %q is not a grant id (g-...)", sub, pos[0])
	}
	if err := c.connect(); err != nil {
		return c.fail("grants", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	st, err := c.store(ctx)
	if err != nil {
		return c.fail("grants", err)
	}
	now := time.Now().UTC()
	switch sub {
	case "list":
		gs, err := listGrants(ctx, st)
		if err != nil {
			return c.fail("grants list", err)
		}
		gs = filterGrants(gs, *all, *tool, *requester, now)
		if c.json {
			out := make([]any, 0, len(gs))
			for _, g := range gs {
				out = append(out, grantJSON(g, now))
			}
			printJSON(out)
			return 0
		}
		if *ids {
			for _, g := range gs {
				fmt.Println(g.GrantID)
			}
			return 0
		}
		printGrantList(os.Stdout, gs, now)
		return 0
	case "show":
		g, _, err := st.Grants.Get(ctx, pos[0])
		if errors.Is(err, store.ErrNotFound) {
			return fail("grants show: no grant %s (see 'tollgate grants list --all')", pos[0])
		}
		if err != nil {
			return c.fail("grants show", err)
		}
		uses, err := grantUses(c.js, g.GrantID)
		if err != nil {
			return c.fail("grants show", err)
		}
		if c.json {
			m := grantJSON(g, now)
			us := make([]any, 0, len(uses))
			for _, u := range uses {
				us = append(us, recordMap(u))
			}
			m["approved"] = us
			printJSON(m)
			return 0
		}
		printGrant(os.Stdout, g, uses, now)
		return 0
	default: // revoke
		g, _, err := grants.Revoke(ctx, c.js, st, pos[0], *by, *reason, now)
		if errors.Is(err, store.ErrNotFound) {
			return fail("grants revoke: no grant %s", pos[0])
		}
		if err != nil {
			return c.fail("grants revoke", err)
		}
		if c.json {
			printJSON(grantJSON(g, now))
			return 0
		}
		fmt.Printf("grant %s revoked by %s at %s\n", g.GrantID, g.Revoked.By, g.Revoked.At.Format(time.RFC3339))
		return 0
	}
}

// listGrants reads every grant record (grants.List), saying which it
// skips.
func listGrants(ctx context.Context, st *store.Store) ([]*schemas.Grant, error) {
	return grants.List(ctx, st, func(key string, err error) {
		fmt.Fprintf(os.Stderr, "tollgate: skipping %s: %v\n", key, err)
	})
}

func filterGrants(gs []*schemas.Grant, all bool, tool, requester string, now time.Time) []*schemas.Grant {
	var out []*schemas.Grant
	for _, g := range gs {
		if !all && g.Ended(now) != nil || tool != "" && g.Tool != tool ||
			requester != "" && (g.Context == nil || g.Context.Requester.Principal != requester) {
			continue
		}
		out = append(out, g)
	}
	return out
}

// grantState is "live", "expired" or "revoked".
func grantState(g *schemas.Grant, now time.Time) string {
	switch schemas.CodeOf(g.Ended(now)) {
	case schemas.CodeGrantRevoked:
		return "revoked"
	case schemas.CodeGrantExpired:
		return "expired"
	}
	return "live"
}

func grantJSON(g *schemas.Grant, now time.Time) map[string]any {
	m, _ := recordMap(g).(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	m["state"] = grantState(g, now)
	return m
}

// grantUses reads the grant's used events: the approvals it decided.
func grantUses(js jetstream.JetStream, id string) ([]*schemas.GrantEvent, error) {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, topology.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{topology.GrantEventSubject(schemas.GrantUsed, id)},
	})
	if err != nil {
		return nil, err
	}
	var out []*schemas.GrantEvent
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			if isTimeout(err) {
				return out, nil
			}
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			ev, err := schemas.Decode[schemas.GrantEvent](m.Data())
			if err != nil {
				fmt.Fprintf(os.Stderr, "tollgate: skipping a grant event: %v\n", err)
				continue
			}
			out = append(out, ev)
		}
		if n == 0 || batch.Error() != nil {
			return out, nil
		}
	}
}

func printGrantList(w io.Writer, gs []*schemas.Grant, now time.Time) {
	if len(gs) == 0 {
		fmt.Fprintln(w, "no grants")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GRANT\tSTATE\tOPTION\tTOOL\tREQUESTER\tBY\tEXPIRES")
	for _, g := range gs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.GrantID, grantState(g, now), g.Option, g.Tool, requester(g.Context), g.Principal, expiry(g.ExpiresAt, now))
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\n'tollgate grants show GRANT' shows one in full.")
}

func printGrant(w io.Writer, g *schemas.Grant, uses []*schemas.GrantEvent, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("grant", "%s (%s)", g.GrantID, grantState(g, now))
	row("covers", "%s", g.Summary)
	row("option", "%s (%s)", g.Option, g.Effect)
	row("tool", "%s", g.Tool)
	scope := string(g.Scope.Kind)
	if g.Scope.SessionID != "" {
		scope += " " + g.Scope.SessionID
	}
	if g.Scope.PathPrefix != "" {
		scope += fmt.Sprintf("; %s under %s", g.Scope.PathField, g.Scope.PathPrefix)
	}
	if len(g.Scope.Values) > 0 {
		scope += fmt.Sprintf("; %s in %q", g.Scope.ValueField, g.Scope.Values)
	}
	row("scope", "%s", scope)
	if tc := g.Context; tc != nil {
		row("requester", "%s  transport %s  trust boundary %s", requester(tc), tc.Transport, tc.TrustBoundary)
		row("made on", "turn %s  %s channel %s  audience %s", tc.TurnID, tc.Channel.Kind, tc.Channel.ID, tc.Audience)
	}
	row("granted by", "%s on approval %s (decision %s)", g.Principal, g.ApprovalID, g.DecisionID)
	row("policy", "%s", g.PolicyVersion)
	row("created", "%s", g.CreatedAt.UTC().Format(time.RFC3339))
	row("expires", "%s (%s)", g.ExpiresAt.UTC().Format(time.RFC3339), expiry(g.ExpiresAt, now))
	if r := g.Revoked; r != nil {
		row("revoked", "by %s at %s: %s", r.By, r.At.UTC().Format(time.RFC3339), r.Reason)
	}
	_ = tw.Flush()
	if len(uses) == 0 {
		fmt.Fprintln(w, "approved: nothing yet")
		return
	}
	fmt.Fprintln(w, "decided:")
	for _, u := range uses {
		fmt.Fprintf(w, "  %s  %s  approval %s  call %s  turn %s\n", u.At.UTC().Format(time.RFC3339), u.Status, u.ApprovalID, u.CallID, u.TurnID)
	}
}
