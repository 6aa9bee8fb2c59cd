package bench

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// stageOfConsumer names the stage behind each durable consumer.
var stageOfConsumer = map[string]string{
	topology.ConsumerIngest: "ingest", topology.ConsumerExecutor: "executor",
	topology.ConsumerApprover: "approver", topology.ConsumerRedriver: "redriver",
	rawConsumer("ingest"): "ingest", rawConsumer("executor"): "executor",
	rawConsumer("approver"): "approver", rawConsumer("redriver"): "redriver",
}

// stager runs stages that can be paused (drained and stopped) and resumed:
// Tollgate's all-in-one stages, or the raw ones.
type stager interface {
	pause(stage string) error
	// resume starts stage again, and returns once it is ready: its
	// watches (the approver's of the approvals, the redriver's of the
	// turn logs) have caught up, as they have in a pipeline that runs.
	resume(stage string) error
	consumer(stage string) string // the stage's durable consumer; "" for one that consumes nothing
}

// traceTurn runs turns of path p through the all-in-one pipeline with the
// tracer listening, and returns the canonical steps of the second turn of
// one session (the first makes the session known, as it is for every turn
// after a session's first), with another session's turn between them.
// traceWait bounds each wait of a traced turn (a publish's acknowledgement,
// a resumed stage's consumer going idle, the outcome). A traced turn runs
// one stage at a time and each resume starts the stage's consumers afresh,
// which on a loaded 2-core machine under the race detector (the smoke
// tests beside four other test binaries) took over 10 s; a passing trace
// never waits this long, a failing one just fails later.
const traceWait = 30 * time.Second

func traceTurn(parent string, keys *seal.KeyRing, p path) ([]step, error) {
	e, err := startEnv(parent, single)
	if err != nil {
		return nil, err
	}
	defer e.close()
	a, err := startAllInOne(e, keys, "info", nil)
	if err != nil {
		return nil, err
	}
	defer a.stop()
	return traceOn(e, a, p, false)
}

// traceSchedule is the order in which the trace lets the stages work on a
// turn of p: "send" publishes the inbound message, "decide" the decision,
// a stage name runs that stage until it has handled everything. The
// executor announces nothing when the batch moves to awaiting (its turn
// log's append is the fact), so the decided event is the redriver's one
// message of the turn: the redriver runs once, after the approver. (A
// decided event that comes before the executor's awaiting append, which
// the stages run one at a time never produce, is NAKed until the batch
// waits, and then handled as traced.) "ready:<stage>" resumes stage
// before the message it handles is published, and waits until it is
// ready: the approver applies a decision on the approval's revision its
// watch delivered (the pending tracker, which starts with the stage), as
// a running approver does, so the watch must have caught up before the
// decision comes. Nothing else works meanwhile, so nothing is
// misattributed.
func traceSchedule(p path) []string {
	if p != approvalPath {
		return []string{"send", "ingest", "executor"}
	}
	return []string{"send", "ingest", "executor", "ready:approver", "decide", "approver", "redriver"}
}

// traceOn traces a turn of path p on e, whose stages st (Tollgate's, or the
// raw ones with raw) run one at a time, following traceSchedule, so that
// each operation is attributed to the one stage working.
func traceOn(e *env, st stager, p path, raw bool) ([]step, error) {
	// Replies to the driver come to inboxes of its own, where the tracer
	// hears the approver's answers to its decisions (a subscription to
	// every inbox would also receive the stages' pull deliveries).
	nc, js, err := e.connect("tollgate-bench-trace", nats.CustomInboxPrefix(traceInboxPrefix))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	d, err := newDriver(nc, js, "trace", p, raw, false, false)
	if err != nil {
		return nil, err
	}
	defer d.close()
	tnc, _, err := e.connect("tollgate-bench-tracer")
	if err != nil {
		return nil, err
	}
	defer tnc.Close()
	tr, err := startTracer(tnc)
	if err != nil {
		return nil, err
	}
	defer tr.stop()
	for _, s := range stageNames {
		if err := st.pause(s); err != nil {
			return nil, err
		}
	}

	one := func(session string) (*turn, error) {
		var t *turn
		for _, s := range traceSchedule(p) {
			switch s {
			case "send":
				if t, err = d.send(session); err != nil {
					return nil, err
				}
				if err := d.waitAsync(traceWait); err != nil {
					return nil, err
				}
			case "ready:approver":
				if err := st.resume("approver"); err != nil {
					return nil, err
				}
			case "decide":
				d.sendDecision(schemas.ApprovalID(t.id, p.approvalIndex()))
				if err := d.waitAsync(traceWait); err != nil {
					return nil, err
				}
			default:
				if err := st.resume(s); err != nil {
					return nil, err
				}
				// A stage that consumes nothing (the raw approver) has
				// answered its request before the decision returned.
				if c := st.consumer(s); c != "" {
					if err := waitIdle(js, stageConsumer[s].Stream, c, traceWait); err != nil {
						return nil, err
					}
				}
				tr.quiesce()
				if err := st.pause(s); err != nil {
					return nil, err
				}
			}
		}
		select {
		case <-t.done:
		case <-time.After(traceWait):
			return nil, fmt.Errorf("trace: no outcome for turn %s", t.id)
		}
		return t, nil
	}
	// The session's first turn makes it known; another session's turn
	// comes between it and the traced one, as under load (the session's
	// previous inbound message is rarely the one just before), so the
	// executor's session-order check looks up the session's inbound
	// messages after its watermark (one stream message get).
	if _, err := one("trace-session"); err != nil {
		return nil, err
	}
	if _, err := one("trace-other"); err != nil {
		return nil, err
	}
	tr.reset()
	t, err := one("trace-session")
	if err != nil {
		return nil, err
	}
	names := [][2]string{
		{schemas.ApprovalID(t.id, p.approvalIndex()), "<approval>"},
		{t.id, "<turn>"},
		{schemas.SessionKey("cli", "trace-session"), "<session>"},
		{benchGrantIndex, "<grant-index>"},
	}
	return canonical(tr.snapshot(), names, stageOfConsumer), nil
}

// quiesce waits until the tracer has seen nothing new for 150ms.
func (t *tracer) quiesce() {
	n, still := -1, time.Now()
	for time.Since(still) < 150*time.Millisecond {
		t.mu.Lock()
		m := len(t.ops)
		t.mu.Unlock()
		if m != n {
			n, still = m, time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitFor(d time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}
