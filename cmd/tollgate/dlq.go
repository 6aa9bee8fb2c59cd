package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
)

var dlqCmd = &command{
	name:    "dlq",
	summary: "list dead-lettered messages: stage, reason code, the turn or message they belong to, and why",
	example: "tollgate dlq --json",
	run:     cmdDLQ,
}

// cmdDLQ lists dead letters: stage, reason code, the turn (and transport
// message or approval) they belong to when their body still names it,
// original subject, size and reason.
func cmdDLQ(cmd *command, args []string) int {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	if exit, ok := c.startNoArgs(cmd, fs, args); !ok {
		return exit
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	cons, err := c.js.OrderedConsumer(ctx, topology.StreamDLQ, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return c.fail("dlq", err)
	}
	rows := []map[string]any{}
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			if isTimeout(err) {
				break
			}
			return c.fail("dlq", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			h := m.Headers()
			code := h.Get(runner.HeaderCode)
			row := map[string]any{
				"stage": h.Get(runner.HeaderStage), "code": code, "reason": reasonOnly(code, h.Get(runner.HeaderReason)),
				"original_subject": h.Get(runner.HeaderOriginalSubject), "original_seq": h.Get(runner.HeaderOriginalSeq), "bytes": len(m.Data()),
			}
			for k, v := range idsOf(m.Data()) {
				row[k] = v
			}
			if meta, _ := m.Metadata(); meta != nil {
				row["dlq_seq"], row["time"] = meta.Sequence.Stream, meta.Timestamp.UTC()
			}
			rows = append(rows, row)
		}
		if n == 0 || batch.Error() != nil {
			break
		}
	}
	if c.json {
		printJSON(rows)
		return 0
	}
	if len(rows) == 0 {
		fmt.Println("no dead letters")
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tSTAGE\tCODE\tTURN\tMESSAGE / APPROVAL\tSUBJECT\tBYTES\tREASON")
	for _, r := range rows {
		fmt.Fprintf(tw, "%v\t%v\t%v\t%s\t%s\t%v\t%v\t%v\n", r["dlq_seq"], r["stage"], r["code"], orDash(r["turn_id"]),
			orDash(r["message_id"], r["approval_id"]), r["original_subject"], r["bytes"], clip(fmt.Sprint(r["reason"]), 80))
	}
	_ = tw.Flush()
	return 0
}

// reasonOnly is a dead letter's reason without its code in front: the
// reason header holds the error's text, which for a coded error starts
// with the code the code header already gives.
func reasonOnly(code, reason string) string {
	if code == "" {
		return reason
	}
	return strings.TrimPrefix(reason, code+": ")
}

// idsOf reads the ids a dead letter's body names, leniently (a body that
// was dead-lettered may not pass validation, or may be cut short): the
// turn id, and the transport message id of an inbound message or the
// approval id of a decision. It returns what it found: keys turn_id,
// message_id and approval_id.
func idsOf(body []byte) map[string]string {
	var v struct {
		TurnID     string `msgpack:"turn_id"`
		Transport  string `msgpack:"transport"`
		MessageID  string `msgpack:"message_id"`
		ApprovalID string `msgpack:"approval_id"`
	}
	out := map[string]string{}
	if msgpack.Unmarshal(body, &v) != nil {
		return out
	}
	turn := v.TurnID
	if v.MessageID != "" {
		out["message_id"] = v.MessageID
		if turn == "" && v.Transport != "" {
			turn = schemas.TurnID(v.Transport, v.MessageID)
		}
	}
	if v.ApprovalID != "" {
		out["approval_id"] = v.ApprovalID
		if turn == "" {
			turn = schemas.TurnIDOfApproval(v.ApprovalID)
		}
	}
	if turn != "" {
		out["turn_id"] = turn
	}
	return out
}

// orDash is the first non-empty value, or "-".
func orDash(vs ...any) string {
	for _, v := range vs {
		if s, _ := v.(string); s != "" {
			return s
		}
	}
	return "-"
}

// isTimeout reports a JetStream fetch that found nothing more.
func isTimeout(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages)
}
