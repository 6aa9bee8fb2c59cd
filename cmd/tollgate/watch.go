package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

var watchCmd = &command{
	name:    "watch",
	summary: "follow events as they are stored: approvals requested and decided, rejections, batch states, redrives, outcomes",
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
// streams it says on errOut what it is waiting for, so that a quiet
// terminal is not mistaken for a hung command.
//
// It follows TOLLGATE_EVENTS, the turn logs (TOLLGATE_TURNLOG_<i>) and
// the approvals bucket's stream, whose revisions that decide an approval
// are its decisions (shown as the approval.decided events they replace;
// a published copy is not shown again):
// a batch's moves to awaiting (it waits for its approvals) and to started
// (they are all decided, its calls free to run) are published nowhere else
// since issue 36 (no batch.awaiting, no redrive.started). Of a turn's log
// it prints each move of the batch to another state, not the batch's
// further writes in the same state (a started batch's claims and results).
// The streams are read side by side: their lines interleave as they come,
// each with its own stream time.
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
	if *turn != "" && !schemas.ValidKey(*turn) {
		return cmd.usageError("--turn %q is not a turn id", *turn)
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy}
	if *all {
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	events := cfg
	if *turn != "" {
		// Events of a turn end in its id; rejections end in an approval id,
		// so name each approval id the turn can have.
		events.FilterSubjects = []string{"tollgate.event.*.*." + *turn}
		for i := 0; i < schemas.MaxCalls; i++ {
			events.FilterSubjects = append(events.FilterSubjects, topology.EventSubject(topology.SubjectDecisionRejected, schemas.ApprovalID(*turn, i)))
		}
	}
	cctx, cancel := c.ctx()
	var its []jetstream.MessagesContext
	stopAll := func() {
		for _, it := range its {
			it.Stop()
		}
	}
	follow := func(stream string, cfg jetstream.OrderedConsumerConfig) error {
		cons, err := c.js.OrderedConsumer(cctx, stream, cfg)
		if err != nil {
			return err
		}
		it, err := cons.Messages()
		if err != nil {
			return err
		}
		its = append(its, it)
		return nil
	}
	err := follow(topology.StreamEvents, events)
	streams := topology.StreamEvents
	var logs []jetstream.Stream
	if err == nil {
		logs, err = topology.OpenTurnLogs(cctx, c.js)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			err = nil // a server provisioned before the turn logs: none to follow
		}
		for i := range logs {
			lc := cfg
			switch p := topology.TurnLogPartition(*turn, len(logs)); {
			case *turn == "":
				lc.FilterSubjects = []string{topology.SubjectTurnLogPrefix + strconv.Itoa(i) + ".>"}
			case i == p:
				lc.FilterSubjects = []string{topology.TurnLogWildcard(i, *turn)}
			default:
				continue
			}
			if err = follow(topology.TurnLogStream(i), lc); err != nil {
				break
			}
		}
		if len(logs) > 0 {
			streams += ", the turn logs"
		}
	}
	var approvals jetstream.KeyValue
	if err == nil {
		// Each approval's decision is its record's revision in the
		// approvals bucket (store.DecidedOf), shown as the decided event it
		// replaces.
		ac := cfg
		ac.FilterSubjects = []string{topology.ApprovalRevisions}
		if *turn != "" {
			ac.FilterSubjects = nil
			for i := 0; i < schemas.MaxCalls; i++ {
				ac.FilterSubjects = append(ac.FilterSubjects, topology.ApprovalRevisionSubject(schemas.ApprovalID(*turn, i)))
			}
		}
		if err = follow(topology.StreamApprovals, ac); err == nil {
			streams += " and the approvals bucket"
			approvals, err = c.js.KeyValue(cctx, topology.BucketApprovals)
		}
	}
	cancel()
	if err != nil {
		stopAll()
		return c.fail("watch", err)
	}
	from := "new events"
	if *all {
		from = "events, from the oldest stored,"
	}
	if *turn != "" {
		from += " of turn " + *turn
	}
	fmt.Fprintf(errOut, "tollgate watch: waiting for %s on %s (%s); Ctrl-C stops\n", from, streams, c.url)
	p := &watchPrinter{out: out, json: c.json, states: map[string]schemas.BatchState{}, logs: logs, approvals: approvals}
	p.enc = json.NewEncoder(out)
	p.enc.SetEscapeHTML(false)
	done := make(chan struct{}, len(its))
	for _, it := range its {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				m, err := it.Next()
				if err != nil {
					return
				}
				p.print(m)
			}
		}()
	}
	// The first reader to end (ctx done, or the connection gone) ends them
	// all.
	ended := 0
	select {
	case <-ctx.Done():
	case <-done:
		ended++
	}
	stopAll()
	for ; ended < len(its); ended++ {
		<-done // nothing is written after runWatch returns
	}
	return 0
}

// watchPrinter prints the messages of the streams watch follows, one at a
// time.
type watchPrinter struct {
	mu   sync.Mutex
	out  io.Writer
	json bool
	enc  *json.Encoder
	// states is each followed turn's batch state as its log last said;
	// a turn is forgotten once its batch ends.
	states map[string]schemas.BatchState
	// logs are the turn-log streams (none on a server provisioned before
	// them).
	logs []jetstream.Stream
	// approvals is the approvals bucket, whose revisions are the
	// decisions.
	approvals jetstream.KeyValue
}

// print writes m's line, or nothing for a turn-log write that leaves the
// batch in the state it was.
func (p *watchPrinter) print(m jetstream.Msg) {
	meta, _ := m.Metadata()
	ts := time.Now()
	if meta != nil {
		ts = meta.Timestamp
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	line := ""
	var outcome *schemas.TurnOutcome       // the turn's outcome a log's outcome event keeps
	var requests []*schemas.ApprovalRecord // the approvals a log's awaiting event requested
	if strings.HasPrefix(m.Subject(), topology.SubjectTurnLogPrefix) {
		var ok bool
		if line, ok = p.batchMove(m.Data()); !ok {
			return
		}
		switch _, turn, event, _ := topology.ParseTurnLogSubject(m.Subject()); event {
		case topology.EventTurnOutcome:
			outcome, _ = store.DecodeOutcome(turn, m.Data())
		case topology.EventTurnAwaiting:
			requests, _ = store.DecodeRequested(turn, m.Data())
		}
	} else if turn, ok := strings.CutPrefix(m.Subject(), topology.SubjectTurnOutcome); ok && p.logHolds(turn) {
		return // a published copy: the turn's outcome is shown from its log
	} else if topology.RouteOf(m.Subject()) == topology.RouteApprovalRequested && p.logKeeps(m.Data()) {
		return // a published copy: the request is shown from its turn's log
	} else if strings.HasPrefix(m.Subject(), topology.ApprovalRevisionPrefix) {
		ev, err := store.DecidedOf(m.Subject(), m.Headers(), m.Data())
		if err != nil || ev == nil {
			return // a pending record, a vote, a marker: no decision
		}
		if data, err := schemas.Encode(ev); err == nil {
			p.line(ts, topology.EventSubject(topology.SubjectApprovalDecided, ev.TurnID), data, "")
		}
		return
	} else if topology.RouteOf(m.Subject()) == topology.RouteApprovalDecided && p.bucketKeeps(m.Data()) {
		return // a published copy: the decision is shown from the bucket
	}
	p.line(ts, m.Subject(), m.Data(), line)
	// What the log's event keeps, shown as the events it replaces.
	for _, a := range requests {
		if data, err := schemas.Encode(a); err == nil {
			p.line(ts, topology.EventSubject(topology.SubjectApprovalRequested, a.TurnID), data, "")
		}
	}
	if outcome != nil {
		data, err := schemas.Encode(outcome)
		if err == nil {
			p.line(ts, topology.EventSubject(topology.SubjectTurnOutcome, outcome.TurnID), data, "")
		}
	}
}

// logKeeps reports whether the turn log of the approval a published
// approval.requested event (data) announces keeps that request, which
// watch shows (as the event it replaces) in place of the published copy.
func (p *watchPrinter) logKeeps(data []byte) bool {
	a, err := schemas.Decode[schemas.ApprovalRecord](data)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, ok, _ := store.LoggedRequest(ctx, p.logs, a.TurnID, a.ApprovalID)
	return ok
}

// bucketKeeps reports whether the approvals bucket holds the decision a
// published approval.decided event (data) announces, which watch shows
// from the bucket's revision in place of the published copy. An event
// that answered a repeated decision (Repeat) is its own.
func (p *watchPrinter) bucketKeeps(data []byte) bool {
	ev, err := schemas.Decode[schemas.DecidedEvent](data)
	if err != nil || ev.Repeat != "" || p.approvals == nil || !schemas.ValidKey(ev.ApprovalID) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := p.approvals.Get(ctx, ev.ApprovalID)
	if err != nil {
		return false
	}
	a, err := schemas.Decode[schemas.ApprovalRecord](e.Value())
	return err == nil && a.Status.Decided()
}

// line writes one event's line (its summary unless line is given), or its
// JSON object.
func (p *watchPrinter) line(ts time.Time, subject string, data []byte, line string) {
	if p.json {
		_ = p.enc.Encode(map[string]any{"subject": subject, "time": ts.UTC(), "event": asMap(data)})
		return
	}
	if line == "" {
		line = summary(subject, data)
	}
	fmt.Fprintf(p.out, "%s  %-48s %s\n", ts.Format("15:04:05.000"), subject, line)
}

// logHolds reports whether turn's log holds its outcome event, which
// watch shows (as the outcome event it replaces) in place of the
// published copy. The log is written before the copy is published.
func (p *watchPrinter) logHolds(turn string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, ok, _ := store.LoggedOutcome(ctx, p.logs, turn)
	return ok
}

// batchMove is the line of a turn-log event, and whether it moved its
// batch to another state (an undecodable event is shown, as such).
func (p *watchPrinter) batchMove(data []byte) (string, bool) {
	b, err := schemas.DecodeBatch(data)
	if err != nil {
		return fmt.Sprintf("%d bytes: %v", len(data), err), true
	}
	if prev, seen := p.states[b.TurnID]; seen && prev == b.State {
		return "", false
	}
	p.states[b.TurnID] = b.State
	if b.State.Terminal() {
		delete(p.states, b.TurnID)
	}
	return batchSummary(b), true
}

// batchSummary is a batch's move to its state in a few words.
func batchSummary(b *schemas.BatchRecord) string {
	line := fmt.Sprintf("batch %s %s", b.TurnID, b.State)
	switch b.State {
	case schemas.BatchAwaiting:
		n := 0
		for _, id := range b.Approvals {
			if id != "" {
				n++
			}
		}
		line += fmt.Sprintf(" (%d approvals)", n)
	case schemas.BatchStarted:
		line += " (approvals decided, calls free to run)"
	case schemas.BatchCompleted, schemas.BatchFailed:
		n := 0
		for _, r := range b.Results {
			if r != nil {
				n++
			}
		}
		line += fmt.Sprintf(" (%d results)", n)
	}
	if b.Code != "" {
		line += " " + string(b.Code)
	}
	if b.Reason != "" {
		line += ": " + clip(reveal.Controls(b.Reason), 80)
	}
	return line
}

func summary(subject string, data []byte) string {
	if topology.RouteOf(subject) == topology.RouteBatchAwaiting {
		// An earlier version's notice, or `tollgate replay`'s nudge: this
		// version's move to awaiting is in the turn's log.
		return "batch awaiting approvals (notice)"
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
