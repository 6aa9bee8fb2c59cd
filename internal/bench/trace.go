package bench

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
)

// The tracer records, from its own connection, every JetStream operation
// the server is asked to perform, by subscribing to the subjects those
// operations use:
//
//   - tollgate.>          a publish into one of Tollgate's streams; on a
//     turn log (tollgate.turnlog.<partition>.<turn>.<event>), an append of
//     the turn's batch record (log.append)
//   - $KV.<bucket>.<key>  a KV write: create (expected last subject
//     sequence 0), update (any other expected sequence) or put (none)
//   - $JS.API.>           API requests: direct gets (KV Get, and the get
//     inside a failed KV Create; a turn log's last event), stream message
//     gets, pull requests, infos
//   - $JS.ACK.>           acknowledgements (and NAK, WPI, TERM), which name
//     the stream and consumer of the message consumed
//   - tollgate.decide.>   (within tollgate.>) a decision sent as a request
//     to the approver's service, in no stream
//   - _INBOX_trace.>      replies to the traced turns' driver (its inbox
//     prefix, traceInboxPrefix): only the approver's answer to a decision
//     request is kept (an "answer", which ends the approver's steps as an
//     acknowledgement ends a consumer's)
//
// Deliveries to a pull consumer go to the client's inbox and are passed
// over; every consumed message is acknowledged once, so the ack stands
// for the consume. Other replies are passed over too: a KV create that fails shows as
// the create followed by a direct get of the same key (nats.go's Create
// reads the key to see whether it was deleted).
type tracer struct {
	mu   sync.Mutex
	ops  []tracedOp
	subs []*nats.Subscription
	t0   time.Time
	// lastRequest is the subject of the last request seen (a decision
	// sent to the approver's service), which an answer is taken to answer.
	lastRequest string
	ch          chan *nats.Msg
	done        chan struct{}
}

// tracedOp is one operation seen by the tracer.
type tracedOp struct {
	At      time.Duration
	Kind    string // publish, request, answer, log.append, kv.create, kv.update, kv.put, kv.get, stream.get, ack, nak, wpi, term, api
	Subject string // as sent
	Target  string // stream subject, bucket/key, or stream/consumer (ack)
	Bytes   int    // payload bytes (publishes and KV writes)
	MsgID   bool   // carries Nats-Msg-Id
}

// traceInboxPrefix is the inbox prefix of the traced turns' driver.
const traceInboxPrefix = "_INBOX_trace"

// startTracer subscribes on nc, which must be used for nothing else that
// is slow. The subscriptions share one channel, which nats.go fills from
// the connection's read loop: the operations are recorded in the order the
// server routed them (separate async subscriptions would each have their
// own goroutine, and lose the order between them).
func startTracer(nc *nats.Conn) (*tracer, error) {
	t := &tracer{t0: time.Now(), ch: make(chan *nats.Msg, 1<<16), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		for m := range t.ch {
			t.record(m)
		}
	}()
	for _, subj := range []string{"tollgate.>", "$KV.>", "$JS.API.>", "$JS.ACK.>", traceInboxPrefix + ".>"} {
		s, err := nc.ChanSubscribe(subj, t.ch)
		if err != nil {
			t.stop()
			return nil, err
		}
		t.subs = append(t.subs, s)
	}
	return t, nc.Flush()
}

func (t *tracer) stop() {
	for _, s := range t.subs {
		_ = s.Unsubscribe()
	}
	close(t.ch)
	<-t.done
}

// reset forgets what was recorded.
func (t *tracer) reset() {
	t.mu.Lock()
	t.ops, t.t0 = nil, time.Now()
	t.mu.Unlock()
}

// snapshot returns what was recorded so far.
func (t *tracer) snapshot() []tracedOp {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]tracedOp(nil), t.ops...)
}

func (t *tracer) record(m *nats.Msg) {
	op := classify(m)
	if op.Kind == "" {
		return
	}
	t.mu.Lock()
	// An answer names the request it answers: the last one sent (the
	// trace sends one decision at a time).
	switch op.Kind {
	case "request":
		t.lastRequest = op.Target
	case "answer":
		op.Target = t.lastRequest
	}
	op.At = time.Since(t.t0)
	t.ops = append(t.ops, op)
	t.mu.Unlock()
}

// classify names the operation m asks for ("" for noise: pull requests,
// infos and other API calls that are not per turn).
func classify(m *nats.Msg) tracedOp {
	op := tracedOp{Subject: m.Subject, Bytes: len(m.Data)}
	if m.Header != nil {
		op.MsgID = m.Header.Get(jetstream.MsgIDHeader) != ""
	}
	switch s := m.Subject; {
	case strings.HasPrefix(s, "$KV."):
		rest := strings.TrimPrefix(s, "$KV.")
		op.Target = strings.Replace(rest, ".", "/", 1)
		switch exp := headerOf(m, jetstream.ExpectedLastSubjSeqHeader); {
		case exp == "0":
			op.Kind = "kv.create"
		case exp != "":
			op.Kind = "kv.update"
		default:
			op.Kind = "kv.put"
		}
	case strings.HasPrefix(s, "$JS.API.DIRECT.GET."):
		// $JS.API.DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key> (a KV get);
		// $JS.API.DIRECT.GET.<stream>.<subject> (the last message on
		// subject, or wildcard: a turn log's last event); or
		// $JS.API.DIRECT.GET.<stream> with the request in the body.
		rest := strings.TrimPrefix(s, "$JS.API.DIRECT.GET.")
		stream, subject, bySubject := strings.Cut(rest, ".")
		switch {
		case bySubject && strings.HasPrefix(subject, "$KV."):
			op.Kind, op.Target = "kv.get", strings.Replace(strings.TrimPrefix(subject, "$KV."), ".", "/", 1)
		case bySubject:
			op.Kind, op.Target = "stream.get", stream+" last "+subject
		default:
			op.Kind, op.Target = "stream.get", rest+getQualifier(m.Data)
		}
		op.Bytes = 0
	case strings.HasPrefix(s, "$JS.API.STREAM.MSG.GET."):
		op.Kind, op.Target, op.Bytes = "stream.get", strings.TrimPrefix(s, "$JS.API.STREAM.MSG.GET.")+getQualifier(m.Data), 0
	case strings.HasPrefix(s, "$JS.API."):
		return tracedOp{} // pull requests, infos, consumer creation: not per turn
	case strings.HasPrefix(s, "$JS.ACK."):
		// $JS.ACK.<stream>.<consumer>.<...>
		parts := strings.Split(s, ".")
		if len(parts) < 4 {
			return tracedOp{}
		}
		op.Target, op.Bytes = parts[2]+"/"+parts[3], 0
		switch body := string(m.Data); {
		case body == "" || strings.HasPrefix(body, "+ACK"):
			op.Kind = "ack"
		case strings.HasPrefix(body, "-NAK"):
			op.Kind = "nak"
		case strings.HasPrefix(body, "+WPI"):
			op.Kind = "wpi"
		case strings.HasPrefix(body, "+TERM"):
			op.Kind = "term"
		default:
			op.Kind = "ack?" + body
		}
	case strings.HasPrefix(s, traceInboxPrefix+"."):
		// A reply: only the approver's answer to a decision request is
		// one of the turn's steps (its Tollgate-Result, or a service
		// error); API replies, acknowledgements of publishes and pull
		// deliveries are not.
		if headerOf(m, submit.HeaderResult) == "" && headerOf(m, micro.ErrorCodeHeader) == "" {
			return tracedOp{}
		}
		op.Kind, op.Bytes = "answer", 0
	case strings.HasPrefix(s, topology.SubjectDecide):
		// A decision sent to the approver's service (pipeline/submit): a
		// core request, in no stream.
		op.Kind, op.Target = "request", s
	case strings.HasPrefix(s, topology.SubjectTurnLogPrefix):
		// An append to a turn's log (jetstream/turnlog: a compare-and-set
		// against the turn's last event), where the stages keep a turn's
		// batch record.
		op.Kind, op.Target = "log.append", s
	default:
		op.Kind, op.Target = "publish", s
	}
	return op
}

// turnLogPartition matches the partition in a turn log's stream name or
// subject (topology.TurnLogStream, topology.TurnLogSubject).
var turnLogPartition = regexp.MustCompile(`(` + regexp.QuoteMeta(topology.StreamTurnLogPrefix) + `|` + regexp.QuoteMeta(topology.SubjectTurnLogPrefix) + `)[0-9]+`)

// canonicalPartitions names the turn's partition of the turn logs <p> in
// s: it is the turn id's hash, which differs from turn to turn.
func canonicalPartitions(s string) string { return turnLogPartition.ReplaceAllString(s, "${1}<p>") }

// getQualifier names what a stream message get asks for: " last <subject>"
// (the last message on a subject) or " next <filter>" (the first message
// on a filter from a sequence on); "" for a plain get by sequence.
func getQualifier(body []byte) string {
	var req struct {
		LastBySubject string `json:"last_by_subj"`
		NextBySubject string `json:"next_by_subj"`
	}
	if json.Unmarshal(body, &req) != nil {
		return ""
	}
	switch {
	case req.LastBySubject != "":
		return " last " + req.LastBySubject
	case req.NextBySubject != "":
		return " next " + req.NextBySubject
	}
	return ""
}

func headerOf(m *nats.Msg, k string) string {
	if m.Header == nil {
		return ""
	}
	return m.Header.Get(k)
}

// step is one operation of a turn in canonical form: ids replaced by the
// names of what they identify (<turn>, <session>, <approval>, <call0>...),
// attributed to the stage whose acknowledgement ends its group.
type step struct {
	Stage string `json:"stage"`
	Op    string `json:"op"`     // publish, request, answer, log.append, kv.create, kv.create(exists), kv.update, kv.get, stream.get, consume+ack
	On    string `json:"on"`     // subject, bucket/key or stream/consumer, canonical
	Bytes int    `json:"bytes"`  // payload size as traced
	MsgID bool   `json:"msg_id"` // publish carries a Nats-Msg-Id
	// Trigger, on a consume+ack of the raw sequences, is the subject prefix
	// of the messages that run the group of steps it ends (not traced).
	Trigger string `json:"trigger,omitempty"`
	// Fact and Pred are the layout phase's (rawseq.go, design a and b):
	// the fact a write makes durable, and ingest's lookup of the session's
	// previous accepted turn (not traced).
	Fact string `json:"fact,omitempty"`
	Pred bool   `json:"pred,omitempty"`
}

// opCreateExists is a KV create of a key that exists: the create fails and
// nats.go then reads the key (two round trips).
const opCreateExists = "kv.create(exists)"

func (s step) String() string {
	id := ""
	if s.MsgID {
		id = " (msg id)"
	}
	b := ""
	if s.Bytes > 0 {
		b = fmt.Sprintf(" %d B", s.Bytes)
	}
	return fmt.Sprintf("%-9s %-18s %s%s%s", s.Stage, s.Op, s.On, id, b)
}

// canonical turns traced operations into steps: names substitute ids, and
// each run of operations up to an acknowledgement is attributed to the
// consumer that acknowledges (the trace is of one turn moving through the
// stages one at a time). Operations after the last acknowledgement (the
// driver's own publishes, before the first consume) are attributed to
// "client". names are (id, name) pairs, replaced in order; consumers maps a consumer name to its stage name.
func canonical(ops []tracedOp, names [][2]string, consumers map[string]string) []step {
	var out []step
	var group []step
	for _, o := range ops {
		on := o.Target
		for _, n := range names {
			on = strings.ReplaceAll(on, n[0], n[1])
		}
		on = canonicalPartitions(on)
		switch o.Kind {
		case "ack":
			stream, cons, _ := strings.Cut(on, "/")
			stage := consumers[cons]
			if stage == "" {
				stage = cons
			}
			for i := range group {
				if group[i].Stage == "" {
					group[i].Stage = stage
				}
			}
			out = append(out, group...)
			group = nil
			out = append(out, step{Stage: stage, Op: "consume+ack", On: stream + "/" + cons})
		case "answer":
			// The approver's answer to a decision request: it ends the
			// approver's group as an acknowledgement ends a consumer's.
			for i := range group {
				if group[i].Stage == "" {
					group[i].Stage = "approver"
				}
			}
			out = append(out, group...)
			group = nil
			out = append(out, step{Stage: "approver", Op: "answer", On: on})
		case "wpi":
			continue // keep-alive of a held message: timing, not the turn's work
		case "kv.get":
			// nats.go's Create reads the key after a create that failed
			// (to see whether it was deleted): one operation, two round trips.
			if n := len(group); n > 0 && group[n-1].Op == "kv.create" && group[n-1].On == on {
				group[n-1].Op = opCreateExists
				continue
			}
			group = append(group, step{Op: o.Kind, On: on})
		default:
			s := step{Op: o.Kind, On: on, Bytes: o.Bytes, MsgID: o.MsgID}
			if (o.Kind == "publish" || o.Kind == "request") && isClientSubject(o.Subject) {
				s.Stage = "client"
				out = append(out, s)
				continue
			}
			group = append(group, s)
		}
	}
	for i := range group {
		if group[i].Stage == "" {
			group[i].Stage = "?"
		}
	}
	return append(out, group...)
}

// isClientSubject: publishes made by the transport or the decider.
func isClientSubject(s string) bool {
	return strings.HasPrefix(s, "tollgate.inbound.") || strings.HasPrefix(s, "tollgate.decision.submit.") || strings.HasPrefix(s, topology.SubjectDecide)
}
