package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

// cmdPending lists approval records in status pending, oldest first.
func cmdPending(args []string) int {
	fs := flag.NewFlagSet("pending", flag.ContinueOnError)
	var c client
	c.register(fs)
	session := fs.String("session", "", "only this session")
	if _, ok := parseFlags(fs, args); !ok {
		return 2
	}
	if err := c.connect(); err != nil {
		return fail("pending: %v", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	st, err := c.store(ctx)
	if err != nil {
		return fail("pending: %v", err)
	}
	// One watcher streams the latest value of every key (a snapshot), instead
	// of a Get round trip per key.
	w, err := st.Approvals.KV.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fail("pending: %v", err)
	}
	defer w.Stop()
	var recs []*schemas.ApprovalRecord
	var raw []any
snapshot:
	for {
		select {
		case <-ctx.Done():
			return fail("pending: listing approvals: %v", ctx.Err())
		case e := <-w.Updates():
			if e == nil {
				break snapshot // every current value has been delivered
			}
			rec, err := schemas.Decode[schemas.ApprovalRecord](e.Value())
			if err != nil {
				fmt.Fprintf(os.Stderr, "tollgate: skipping %s: %v\n", e.Key(), err)
				continue
			}
			if rec.Status != schemas.ApprovalPending || (*session != "" && rec.SessionID != *session) {
				continue
			}
			recs = append(recs, rec)
			raw = append(raw, asMap(e.Value()))
		}
	}
	order := make([]int, len(recs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return recs[order[a]].RequestedAt.Before(recs[order[b]].RequestedAt) })
	if c.json {
		out := make([]any, 0, len(recs))
		for _, i := range order {
			out = append(out, raw[i])
		}
		printJSON(out)
		return 0
	}
	if len(recs) == 0 {
		fmt.Println("no pending approvals")
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "APPROVAL\tSESSION\tREQUESTER\tTOOL\tARGS\tOPTIONS\tAGE\tEXPIRES")
	for _, i := range order {
		r := recs[i]
		requester := "?"
		if r.Context != nil {
			requester = r.Context.Requester.Principal
		}
		expires := "never"
		if !r.ExpiresAt.IsZero() {
			expires = "in " + time.Until(r.ExpiresAt).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ApprovalID, r.SessionID, requester, r.Tool,
			clip(r.Args, 60), strings.Join(r.Options, ","), time.Since(r.RequestedAt).Round(time.Second), expires)
	}
	_ = tw.Flush()
	return 0
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// cmdDecide publishes a decision and waits for the approver's answer: the
// decided event or a rejection with its reason code (exit status 1).
func cmdDecide(option string, args []string) int {
	fs := flag.NewFlagSet(option, flag.ContinueOnError)
	var c client
	c.register(fs)
	as := fs.String("as", "", "decider's sender id on the transport (required)")
	transport := fs.String("transport", "cli", "transport the decision arrives on")
	kind := fs.String("sender-kind", "user", "user, bot or service")
	verified := fs.Bool("verified", true, "the transport verified the decider's identity")
	digest := fs.String("digest", "", "argument digest the decider was shown (sha256:...); rejected if it differs")
	note := fs.String("note", "", "free-text note")
	noWait := fs.Bool("no-wait", false, "publish and exit without waiting for the approver")
	pos, ok := parseFlags(fs, args)
	if !ok {
		return 2
	}
	if len(pos) != 1 || *as == "" {
		return fail("%s: usage: tollgate %s APPROVAL_ID --as SENDER", option, option)
	}
	id := pos[0]
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	d := &schemas.Decision{
		DecisionID: "d-" + hex.EncodeToString(b), ApprovalID: id, Transport: *transport,
		Decider: schemas.Sender{ID: *as, Kind: schemas.SenderKind(*kind), Verified: *verified},
		Option:  option, ArgsDigest: *digest, Note: *note, SentAt: time.Now().UTC(),
	}
	if _, err := schemas.Encode(d); err != nil {
		return fail("%s: %v", option, err)
	}
	if !schemas.ValidKey(id) {
		return fail("%s: %q is not an approval id", option, id)
	}
	if err := c.connect(); err != nil {
		return fail("%s: %v", option, err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()

	// Subscribe before publishing so the answer cannot be missed.
	answers := make(chan *nats.Msg, 64)
	var subs []*nats.Subscription
	subjects := []string{topology.EventSubject(topology.SubjectDecisionRejected, id)}
	if turn := schemas.TurnIDOfApproval(id); turn != "" {
		subjects = append(subjects, topology.EventSubject(topology.SubjectApprovalDecided, turn))
	}
	for _, s := range subjects {
		sub, err := c.nc.ChanSubscribe(s, answers)
		if err != nil {
			return fail("%s: %v", option, err)
		}
		subs = append(subs, sub)
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	if err := c.nc.Flush(); err != nil {
		return fail("%s: %v", option, err)
	}
	if err := bus.Publish(ctx, c.js, topology.DecisionSubject(*transport, id), d.DecisionID, d); err != nil {
		return fail("%s: %v", option, err)
	}
	if *noWait {
		return report(c.json, map[string]any{"decision_id": d.DecisionID, "approval_id": id, "status": "submitted"}, "submitted "+d.DecisionID)
	}
	for {
		select {
		case <-ctx.Done():
			return fail("%s: no answer from the approver within %v (decision %s is stored and will be applied when it runs)", option, c.timeout, d.DecisionID)
		case m := <-answers:
			if strings.HasPrefix(m.Subject, topology.SubjectDecisionRejected) {
				rej, err := schemas.Decode[schemas.DecisionRejected](m.Data)
				if err != nil || rej.DecisionID != d.DecisionID {
					continue
				}
				if c.json {
					printJSON(asMap(m.Data))
				} else {
					fmt.Fprintf(os.Stderr, "rejected: %s: %s\n", rej.Code, rej.Reason)
				}
				return 1
			}
			ev, err := schemas.Decode[schemas.DecidedEvent](m.Data)
			if err != nil || ev.ApprovalID != id {
				continue
			}
			return report(c.json, asMap(m.Data), fmt.Sprintf("%s %s (turn %s)", ev.Status, id, ev.TurnID))
		}
	}
}

func report(asJSON bool, v any, human string) int {
	if asJSON {
		printJSON(v)
	} else {
		fmt.Println(human)
	}
	return 0
}

// isTimeout reports a JetStream fetch that found nothing more.
func isTimeout(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages)
}
