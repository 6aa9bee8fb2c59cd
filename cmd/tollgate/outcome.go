package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// cmdOutcome prints a turn's batch state and tool results. With --wait it
// polls until the turn is terminal (exit 3 if it is not by then).
func cmdOutcome(args []string) int {
	fs := flag.NewFlagSet("outcome", flag.ContinueOnError)
	var c client
	c.register(fs)
	wait := fs.Duration("wait", 0, "wait up to this long for a terminal state")
	pos, ok := parseFlags(fs, args)
	if !ok {
		return 2
	}
	if len(pos) != 1 || !schemas.ValidKey(pos[0]) {
		return fail("outcome: usage: tollgate outcome TURN_ID [--wait 10s]")
	}
	turn := pos[0]
	if *wait+5*time.Second > c.timeout {
		c.timeout = *wait + 5*time.Second
	}
	if err := c.connect(); err != nil {
		return fail("outcome: %v", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	st, err := c.store(ctx)
	if err != nil {
		return fail("outcome: %v", err)
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
			return 3
		case err != nil:
			return fail("outcome: %v", err)
		}
		if !b.State.Terminal() && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if c.json {
			e, err := st.Batches.KV.Get(ctx, turn)
			if err != nil {
				return fail("outcome: %v", err)
			}
			printJSON(asMap(e.Value()))
		} else {
			printBatch(b)
		}
		if !b.State.Terminal() && *wait > 0 {
			return 3
		}
		return 0
	}
}

func printBatch(b *schemas.BatchRecord) {
	fmt.Printf("turn %s  session %s  state %s", b.TurnID, b.SessionID, b.State)
	if b.Code != "" {
		fmt.Printf("  code %s: %s", b.Code, b.Reason)
	}
	fmt.Println()
	if b.Context != nil {
		fmt.Printf("requester %s  audience %s  channel %s/%s\n", b.Context.Requester.Principal, b.Context.Audience, b.Context.Channel.Kind, b.Context.Channel.ID)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tTOOL\tAPPROVAL\tSTATUS\tOUTPUT / REASON")
	for i, call := range b.Calls {
		status, detail := "waiting", ""
		if r := b.Results[i]; r != nil {
			status, detail = string(r.Status), r.Output
			if r.Code != "" {
				detail = string(r.Code) + ": " + r.Reason
			}
		}
		appr := b.Approvals[i]
		if appr == "" {
			appr = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", call.CallID, call.Tool, appr, status, clip(strings.ReplaceAll(detail, "\n", " "), 80))
	}
	_ = tw.Flush()
}

// cmdWatch prints events as they are stored: approval requests, decisions,
// rejections, redrive outcomes and turn outcomes.
func cmdWatch(args []string) int {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	var c client
	c.register(fs)
	turn := fs.String("turn", "", "only events of this turn")
	all := fs.Bool("all", false, "start from the oldest stored event instead of now")
	if _, ok := parseFlags(fs, args); !ok {
		return 2
	}
	if err := c.connect(); err != nil {
		return fail("watch: %v", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}
	if *all {
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	if *turn != "" {
		// Events of a turn end in its id; rejections end in an approval id,
		// so name each approval id the turn can have.
		cfg.FilterSubjects = []string{"tollgate.event.*.*." + *turn}
		for i := 0; i < schemas.MaxCalls; i++ {
			cfg.FilterSubjects = append(cfg.FilterSubjects, topology.EventSubject(topology.SubjectDecisionRejected, schemas.ApprovalID(*turn, i)))
		}
	}
	cons, err := c.js.OrderedConsumer(ctx, topology.StreamEvents, cfg)
	cancel()
	if err != nil {
		return fail("watch: %v", err)
	}
	sig, stop := signalCtx()
	defer stop()
	it, err := cons.Messages()
	if err != nil {
		return fail("watch: %v", err)
	}
	go func() { <-sig.Done(); it.Stop() }()
	for {
		m, err := it.Next()
		if err != nil {
			return 0
		}
		meta, _ := m.Metadata()
		ts := time.Now()
		if meta != nil {
			ts = meta.Timestamp
		}
		if c.json {
			printJSON(map[string]any{"subject": m.Subject(), "time": ts.UTC(), "event": asMap(m.Data())})
			continue
		}
		fmt.Printf("%s  %-48s %s\n", ts.Format("15:04:05.000"), m.Subject(), summary(m.Subject(), m.Data()))
	}
}

func summary(subject string, data []byte) string {
	switch {
	case strings.HasPrefix(subject, topology.SubjectApprovalRequested):
		if a, err := schemas.Decode[schemas.ApprovalRecord](data); err == nil {
			return fmt.Sprintf("approval %s: %s %s, options %v", a.ApprovalID, a.Tool, clip(a.Args, 50), a.Options)
		}
	case strings.HasPrefix(subject, topology.SubjectApprovalDecided):
		if e, err := schemas.Decode[schemas.DecidedEvent](data); err == nil {
			by := ""
			if e.Decision != nil {
				by = " by " + e.Decision.Principal
			}
			return fmt.Sprintf("approval %s %s%s", e.ApprovalID, e.Status, by)
		}
	case strings.HasPrefix(subject, topology.SubjectDecisionRejected):
		if r, err := schemas.Decode[schemas.DecisionRejected](data); err == nil {
			return fmt.Sprintf("decision %s rejected: %s: %s", r.DecisionID, r.Code, r.Reason)
		}
	case strings.HasPrefix(subject, topology.SubjectRedrive):
		if o, err := schemas.Decode[schemas.RedriveOutcome](data); err == nil {
			return fmt.Sprintf("redrive %s %s %s", o.Kind, o.Code, o.Reason)
		}
	case strings.HasPrefix(subject, topology.SubjectTurnOutcome):
		if o, err := schemas.Decode[schemas.TurnOutcome](data); err == nil {
			return fmt.Sprintf("turn %s %s (%d results) -> %s %s/%s", o.TurnID, o.State, len(o.Results), o.Reply.Transport, o.Reply.Channel.Kind, o.Reply.Channel.ID)
		}
	case strings.HasPrefix(subject, topology.SubjectBatchAwaiting):
		return "batch awaiting approvals"
	}
	return fmt.Sprintf("%d bytes", len(data))
}

// cmdDLQ lists dead letters: stage, reason code, original subject and size.
func cmdDLQ(args []string) int {
	fs := flag.NewFlagSet("dlq", flag.ContinueOnError)
	var c client
	c.register(fs)
	if _, ok := parseFlags(fs, args); !ok {
		return 2
	}
	if err := c.connect(); err != nil {
		return fail("dlq: %v", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	cons, err := c.js.OrderedConsumer(ctx, topology.StreamDLQ, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return fail("dlq: %v", err)
	}
	var rows []map[string]any
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			if isTimeout(err) {
				break
			}
			return fail("dlq: %v", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			h := m.Headers()
			meta, _ := m.Metadata()
			row := map[string]any{
				"stage": h.Get(runner.HeaderStage), "code": h.Get(runner.HeaderCode), "reason": h.Get(runner.HeaderReason),
				"original_subject": h.Get(runner.HeaderOriginalSubject), "original_seq": h.Get(runner.HeaderOriginalSeq), "bytes": len(m.Data()),
			}
			if meta != nil {
				row["dlq_seq"], row["time"] = meta.Sequence.Stream, meta.Timestamp.UTC()
			}
			rows = append(rows, row)
		}
		if n == 0 || batch.Error() != nil {
			break
		}
	}
	if c.json {
		if rows == nil {
			rows = []map[string]any{}
		}
		printJSON(rows)
		return 0
	}
	if len(rows) == 0 {
		fmt.Println("no dead letters")
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tSTAGE\tCODE\tSUBJECT\tBYTES\tREASON")
	for _, r := range rows {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%v\t%v\t%v\n", r["dlq_seq"], r["stage"], r["code"], r["original_subject"], r["bytes"], clip(fmt.Sprint(r["reason"]), 80))
	}
	_ = tw.Flush()
	return 0
}
