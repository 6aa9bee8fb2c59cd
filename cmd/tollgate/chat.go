package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

var chatCmd = &command{
	name:    "chat",
	args:    "--session ID --sender ID TEXT",
	summary: "send a chat message to the planner (the agent loop) and follow it live: tool calls, approval prompts, results, the reply",
	example: `tollgate chat --session demo --sender alice "save a note saying buy milk"`,
	run:     cmdChat,
}

// cmdChat publishes a text message as the cli transport would, then follows
// the turn's events (its step batches' too) until its outcome: each
// approval prompt is shown, and answered from stdin when --answer is on
// (a line "a" approves, "d" denies, as the sender), the step results, and
// the reply. It exits 0 when the turn completed, 1 when it failed or the
// wait (--wait) ran out. Without a planner it exits 1 saying so: before
// publishing when the planner's consumer does not exist, else when the
// turn completes with no calls and no reply (ingest did not route it to a
// planner).
func cmdChat(cmd *command, args []string) int {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	session := fs.String("session", "", "session id (required)")
	sender := fs.String("sender", "", "sender id on the transport (required)")
	transport := fs.String("transport", "cli", "transport name")
	chKind := fs.String("channel-kind", "dm", "dm, private or public")
	wait := fs.Duration("wait", 10*time.Minute, "how long to follow the turn")
	answer := fs.Bool("answer", true, "answer approval prompts from stdin as the sender (a: approve, d: deny); --answer=false only shows them")
	policyPath := fs.String("policy", scaffold.Env("TOLLGATE_POLICY", ""), "policy JSON the message is checked against, as ingest checks it (env TOLLGATE_POLICY)")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) != 1 || *session == "" || *sender == "" {
		return cmd.usageError("want --session, --sender and one message text")
	}
	pol, err := policy.Load(*policyPath)
	if err != nil {
		return fail("chat: %v", err)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	msgID := "m-" + hex.EncodeToString(b)
	msg := &schemas.InboundMessage{
		Transport: *transport, MessageID: msgID, SessionID: *session,
		Sender:  schemas.Sender{ID: *sender, Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "dm-" + *sender, Kind: schemas.ChannelKind(*chKind)},
		Text:    pos[0], SentAt: time.Now().UTC(),
	}
	subject := topology.InboundSubject(*transport, *session)
	data, err := schemas.Encode(msg)
	if err == nil {
		_, err = ingest.Admit(subject, data, pol, schemas.Provenance{})
	}
	if err != nil {
		return fail("chat: refused, nothing was published: %v", err)
	}
	if err := c.connect(); err != nil {
		return c.fail("chat", err)
	}
	defer c.close()
	turn := schemas.TurnID(*transport, msgID)
	// Without a planner a text-only message is a turn with no calls, which
	// completes at once with nothing said: refuse before publishing when
	// none was ever started here.
	cctx, cancel := c.ctx()
	_, err = c.js.Consumer(cctx, topology.StreamTurns, topology.ConsumerPlanner)
	cancel()
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fail("chat: no planner is running, nothing was published: %s", noPlanner)
	}
	// Any other error (a NATS user without the right to look) leaves it
	// to the outcome: a turn with no calls and no reply says the same.

	// Follow the events from before the message is published, so that
	// nothing of the turn is missed: TOLLGATE_EVENTS, the turns' requests
	// and outcomes, which the turn logs keep, and the approvals'
	// decisions, which the approvals bucket keeps (transport/eventfeed
	// merges them: a request before its decision, each turn's outcome
	// after its other events).
	feed := eventfeed.New(c.js, slog.New(slog.DiscardHandler))
	defer feed.Close()
	cctx, cancel = c.ctx()
	sub, err := feed.Subscribe(cctx, eventfeed.Options{New: true})
	cancel()
	if err != nil {
		return c.fail("chat", err)
	}
	defer sub.Close()
	pctx, pcancel := c.ctx()
	_, err = bus.Store(pctx, c.js, subject, topology.InboundMsgID(*transport, msgID), data, nil)
	pcancel()
	if err != nil {
		return c.fail("chat", err)
	}
	fmt.Printf("%s: %s   (turn %s)\n", *sender, pos[0], turn)

	sig, stop := signalCtx()
	defer stop()
	ctx, cancelWait := context.WithTimeout(sig, *wait)
	defer cancelWait()
	var lines chan string
	if *answer {
		lines = readLines(os.Stdin)
	}
	ch := &chatView{c: &c, transport: *transport, sender: *sender, out: os.Stdout, lines: lines}
	if c.json {
		ch.enc = json.NewEncoder(os.Stdout)
	}
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			return fail("chat: stopped following turn %s before its outcome", turn)
		}
		id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		if id != turn && !schemas.DescendsFrom(id, turn) {
			continue
		}
		if done, code := ch.show(ctx, turn, m.Subject, m.Data); done {
			return code
		}
	}
}

// chatView prints a turn's events for a person.
type chatView struct {
	c         *client
	transport string
	sender    string
	out       io.Writer
	lines     chan string
	enc       *json.Encoder // --json: each event as a JSON line instead of text
	replied   bool          // a reply event was shown
}

// noPlanner says how to run a planner.
const noPlanner = "Chat needs the planner stage: start tollgate dev with a model, e.g. " +
	"tollgate dev --llm-url http://127.0.0.1:11434/v1 --llm-model qwen2.5:7b (or run the planner binary and ingest --plan; docs/planner.md)"

// show prints one event of the turn; done reports that it was the turn's
// outcome, with the exit code.
func (v *chatView) show(ctx context.Context, turn, subject string, data []byte) (done bool, code int) {
	out := v.out
	if v.enc != nil {
		_ = v.enc.Encode(map[string]any{"subject": subject, "event": asMap(data)})
		v.out = io.Discard
		defer func() { v.out = out }()
	}
	_, rec, _ := topology.Read(subject, data, topology.RouteApprovalRequested, topology.RouteApprovalDecided,
		topology.RouteTurnReply, topology.RouteTurnOutcome)
	switch rec := rec.(type) {
	case *schemas.ApprovalRecord:
		a := rec
		args, flagged := reveal.JSON(a.Args)
		fmt.Fprintf(v.out, "  ? approval needed: %s %s (options %v)\n", a.Tool, clip(args, 200), a.Options)
		if flagged {
			fmt.Fprintln(v.out, warnLine)
		}
		if v.lines == nil {
			fmt.Fprintf(v.out, "    decide with: tollgate approve %s --as <decider>   (or deny)\n", a.ApprovalID)
			return false, 0
		}
		fmt.Fprintf(v.out, "    approve? [a]pprove / [d]eny: ")
		v.decide(ctx, a)
	case *schemas.DecidedEvent:
		fmt.Fprintf(v.out, "  approval %s\n", rec.Status)
	case *schemas.ReplyEvent:
		v.replied = true
		fmt.Fprintf(v.out, "assistant: %s\n", reveal.Controls(rec.Text))
	case *schemas.TurnOutcome:
		o := rec
		if o.TurnID != turn {
			for _, r := range o.Results {
				detail := clip(reveal.Controls(r.Output), 200)
				if r.Status != schemas.ResultOK {
					detail = string(r.Code) + " " + clip(reveal.Controls(r.Reason), 200)
				}
				fmt.Fprintf(v.out, "  %s: %s %s\n", r.Tool, r.Status, detail)
			}
			return false, 0
		}
		if o.State == schemas.TurnCompleted && len(o.Results) == 0 && !v.replied {
			// A planner turn ends with a reply; this one was taken as a
			// turn with no calls: ingest routes nothing to a planner.
			fmt.Fprintf(os.Stderr, "tollgate chat: no planner answered: the turn completed with no calls and no reply. %s\n", noPlanner)
			return true, 1
		}
		if o.State == schemas.TurnCompleted {
			return true, 0
		}
		fmt.Fprintf(v.out, "turn failed: %s %s\n", o.Code, reveal.Controls(o.Reason))
		return true, 1
	}
	return false, 0
}

// decide reads the person's answer to approval a and submits it as the
// sender's decision.
func (v *chatView) decide(ctx context.Context, a *schemas.ApprovalRecord) {
	var line string
	select {
	case <-ctx.Done():
		return
	case l, ok := <-v.lines:
		if !ok {
			fmt.Fprintln(v.out, "(no input: left pending)")
			return
		}
		line = strings.ToLower(strings.TrimSpace(l))
	}
	option := schemas.OptionDeny
	if line == "a" || line == "approve" || line == "y" || line == "yes" {
		option = schemas.OptionApprove
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	d := &schemas.Decision{
		DecisionID: "d-" + hex.EncodeToString(b), ApprovalID: a.ApprovalID, Transport: v.transport,
		Decider: schemas.Sender{ID: v.sender, Kind: schemas.SenderUser, Verified: true},
		Option:  option, ArgsDigest: a.ArgsDigest, SentAt: time.Now().UTC(),
	}
	pctx, cancel := v.c.ctx()
	defer cancel()
	if _, err := submit.Decision(pctx, v.c.js, d); err != nil {
		fmt.Fprintf(v.out, "  (decision not sent: %v)\n", err)
	}
}

// readLines delivers r's lines until it ends.
func readLines(r io.Reader) chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		s := bufio.NewScanner(r)
		for s.Scan() {
			ch <- s.Text()
		}
	}()
	return ch
}
