package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

var watchCmd = &command{
	name:    "watch",
	summary: "follow events as they are stored: approvals requested and decided, rejections, redrives, outcomes",
	example: "tollgate watch --turn t-0123456789abcdef0123 --json",
	run:     cmdWatch,
}

// cmdWatch prints events until SIGINT or SIGTERM.
func cmdWatch(cmd *command, args []string) int {
	sig, stop := signalCtx()
	defer stop()
	return runWatch(sig, cmd, args, os.Stdout, os.Stderr)
}

// runWatch prints events on out until ctx is done: one line per event, or
// with --json one JSON object per line (JSON Lines). Once it follows the
// stream it says on errOut what it is waiting for, so that a quiet
// terminal is not mistaken for a hung command.
func runWatch(ctx context.Context, cmd *command, args []string, out, errOut io.Writer) int {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	turn := fs.String("turn", "", "only events of this turn")
	all := fs.Bool("all", false, "start from the oldest stored event instead of now")
	if exit, ok := c.startNoArgs(cmd, fs, args); !ok {
		return exit
	}
	defer c.close()
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
	cctx, cancel := c.ctx()
	cons, err := c.js.OrderedConsumer(cctx, topology.StreamEvents, cfg)
	cancel()
	if err != nil {
		return c.fail("watch", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return c.fail("watch", err)
	}
	go func() { <-ctx.Done(); it.Stop() }()
	from := "new events"
	if *all {
		from = "events, from the oldest stored,"
	}
	if *turn != "" {
		from += " of turn " + *turn
	}
	fmt.Fprintf(errOut, "tollgate watch: waiting for %s on %s (%s); Ctrl-C stops\n", from, topology.StreamEvents, c.url)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
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
			_ = enc.Encode(map[string]any{"subject": m.Subject(), "time": ts.UTC(), "event": asMap(m.Data())})
			continue
		}
		fmt.Fprintf(out, "%s  %-48s %s\n", ts.Format("15:04:05.000"), m.Subject(), summary(m.Subject(), m.Data()))
	}
}

func summary(subject string, data []byte) string {
	if topology.RouteOf(subject) == topology.RouteBatchAwaiting {
		return "batch awaiting approvals"
	}
	_, rec, _ := topology.Read(subject, data, topology.RouteApprovalRequested, topology.RouteApprovalDecided,
		topology.RouteDecisionRejected, topology.RouteRedrive, topology.RouteTurnOutcome, topology.RouteTurnReply)
	switch rec := rec.(type) {
	case *schemas.ApprovalRecord:
		args, flagged := reveal.JSON(rec.Args)
		line := fmt.Sprintf("approval %s: %s %s, options %v", rec.ApprovalID, rec.Tool, clip(args, 50), rec.Options)
		if flagged {
			line += warnLine
		}
		return line
	case *schemas.DecidedEvent:
		by := ""
		if rec.Decision != nil {
			by = " by " + reveal.Must(rec.Decision.Principal)
		}
		return fmt.Sprintf("approval %s %s%s", rec.ApprovalID, rec.Status, by)
	case *schemas.DecisionRejected:
		return fmt.Sprintf("decision %s rejected: %s: %s", reveal.Must(rec.DecisionID), rec.Code, reveal.Controls(rec.Reason))
	case *schemas.RedriveOutcome:
		return fmt.Sprintf("redrive %s %s %s", rec.Kind, rec.Code, reveal.Controls(rec.Reason))
	case *schemas.TurnOutcome:
		to := fmt.Sprintf("-> %s %s/%s", rec.Reply.Transport, rec.Reply.Channel.Kind, rec.Reply.Channel.ID)
		if rec.Audience == "" {
			// protocol §6: no verified context of the turn, so no reply target.
			to = "-> nowhere (" + string(rec.Code) + ")"
		}
		return fmt.Sprintf("turn %s %s (%d results) %s", rec.TurnID, rec.State, len(rec.Results), to)
	case *schemas.ReplyEvent:
		return fmt.Sprintf("reply to %s %s/%s: %s", rec.Reply.Transport, rec.Reply.Channel.Kind, rec.Reply.Channel.ID, clip(reveal.Controls(rec.Text), 80))
	}
	return fmt.Sprintf("%d bytes", len(data))
}
