package bench

import (
	"slices"
	"strconv"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// The raw turns: the JetStream operations one Tollgate turn performs, in
// order, as traced from the real stages (traceTurn) for the second turn of
// a session (the session's record exists and is free), another session's
// turn between the two. Ingest appends the turn to its session's order
// (jetstream/turnorder: a publish by compare-and-set against the session's
// last entry, which the ingest that appended the session's first turn
// remembers, so it reads nothing first; the raw ingest appends through the
// same writer). Before the append it looks up the session's first inbound
// message after the order's arrival watermark (pipeline/sessionorder,
// Gate: one stream message get with a subject filter), which under load,
// as in the trace, is the turn's own message with others' in between. Placeholders:
// <turn> the turn id, <session> the session key, <approval> the approval id
// of the call that needs one, <p> the turn's partition of the turn logs.
// Byte sizes are those of the built-in policy's turns; each run replaces
// them with the traced sizes when the trace has the same shape (see
// calibrate).
//
// A turn's batch record is kept in its turn's log (store.Batches, issue
// 36): each write of it is an append (log.append) of the whole record to
// tollgate.turnlog.<p>.<turn>.<state>, by compare-and-set against the
// turn's last event (jetstream/turnlog), and a read of it is a get of the
// turn's last event (a stream.get on its wildcard). The executor creates
// the batch of a turn that came as an entry of its session's order without
// reading tollgate_batches first (store.Batches.Create: no version that
// places turns keeps batches there).
//
// The turn runs once its predecessor in its session's order has ended
// (batch.Engine.ItsTurn, docs/protocol.md §1.4): the entry names it, and
// the engine that ended it remembers it ended, and at which place (the
// executor's and the redriver's, one engine in one process), so the
// executor reads nothing for it. (A stage process that did not end the
// previous turn reads its last event first: one stream.get more, not in
// the traced all-in-one turn.) No session record is read or written. The
// executor creates the batch already running with call 0 claimed
// (startAtOnce: a turn that must wait is created queued instead). Whoever
// ends the batch reads nothing for the session: a turn queued behind it
// is woken by the redriver's watch of the turn logs, which delivers the
// end (batch.Engine.Wake); in the trace none waits. (Until session 30 the
// ender read the session's next entry, a message get with next_by_subj
// on the order's wildcard: one JetStream API request per turn.)
//
// A call's execution claim is in its batch record (pipeline/batch, Run):
// the executor's move to running claims the call it runs at once, and the
// write that completes (or awaits) carries its result; the redriver's move
// to started claims the approved call, and its completion carries the
// result. After the outcome, the stage that ends the batch retires the
// turn's approvals (batch.Engine's retire): each is read, and written
// again with a TTL only if it has none. Today none needs it: an approval's
// retention started when it was decided (with the TTL). The redriver reads
// neither the approval its trigger decided nor, to retire it, its
// retention: the decided revision it consumed holds both (the record, and
// the TTL header; store.DecisionOf, batch.Known.Retained).
//
// The approver applies a decision on the approval's revision its pending
// tracker's watch delivered (approver.PendingTracker.Latest), by
// compare-and-set at that revision: it reads the bucket only when the
// watch has not delivered it yet, or after a conflict.
//
// Before it creates an approval, the executor looks up the standing grants
// of the call's tool and requester (one read of their grant index:
// pipeline/grants) only where the policy offers a grant option for the
// tool; the bench's policy (policy.Default) offers none for write_file, so
// neither Tollgate nor the raw turn reads tollgate_grants.
//
// Besides these, Tollgate's approver watches the approvals bucket and its
// redriver the turn logs and the batches and sessions buckets (ordered push consumers
// that receive every write, for the pending set and expiry, and for the
// recovery sweep); the raw approver and redriver run the same watches and
// discard what they receive.

// rawFast: one echo call, run at once.
var rawFast = []step{
	{Stage: "client", Op: "publish", On: "tollgate.inbound.cli.<session>", MsgID: true, Bytes: 213},
	{Stage: "ingest", Op: "stream.get", On: "TOLLGATE_INBOUND next tollgate.inbound.cli.<session>"},     // arrival order: the session's next message after the order's watermark
	{Stage: "ingest", Op: "publish", On: "tollgate.turn.order.exec.<session>", MsgID: true, Bytes: 713}, // after the session's last entry, which ingest remembers
	{Stage: "ingest", Op: "consume+ack", On: "TOLLGATE_INBOUND/ingest", Trigger: topology.SubjectInboundPrefix},
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>.running", MsgID: true, Bytes: 855}, // call 0 claimed
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>.outcome", MsgID: true, Bytes: 942}, // call 0's result and the outcome
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnOrder},
}

// rawApproval: an echo call (run at once) and a write_file call (needs
// approval, approved by the decider). The executor announces nothing when
// the batch moves to awaiting (issue 36: the turn log's awaiting append is
// the fact), and the approver nothing when it decides (the approval
// record's revision is the decided event: its Fact decided, which the
// raw stages send as a Bench-Fact header on the KV write, where the
// redriver's durable on the bucket's stream tells it from the creation),
// so the decision's revision is the redriver's one trigger: it takes the
// batch from the turn's awaiting event that its recovery sweep's watch of
// the turn logs delivered (reading the turn's last event only when the
// watch has not delivered it yet) and the approval from the revision
// itself, moves the batch to started by compare-and-set after that event
// (the
// log's started append is the fact: no redrive outcome is published for
// it), runs the approved call and completes the batch. The awaiting
// append is also the approval's request (it keeps the record: no
// approval.requested is published), so a decider that answers it finds
// the batch waiting; a decided event that
// still reaches the redriver first (a decision made from the approvals
// bucket itself) is NAKed until the batch waits (pipeline/redriver,
// errBeforeAwaiting): then the same group, later. The trace lets the executor finish before the
// decision is submitted, so it shows the group once.
var rawApproval = []step{
	{Stage: "client", Op: "publish", On: "tollgate.inbound.cli.<session>", MsgID: true, Bytes: 273},
	{Stage: "ingest", Op: "stream.get", On: "TOLLGATE_INBOUND next tollgate.inbound.cli.<session>"},
	{Stage: "ingest", Op: "publish", On: "tollgate.turn.order.exec.<session>", MsgID: true, Bytes: 898},
	{Stage: "ingest", Op: "consume+ack", On: "TOLLGATE_INBOUND/ingest", Trigger: topology.SubjectInboundPrefix},
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>.running", MsgID: true, Bytes: 1043}, // call 0 claimed
	{Stage: "executor", Op: "kv.create", On: "tollgate_approvals/<approval>", Bytes: 925},
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>.awaiting", MsgID: true, Bytes: 1591}, // call 0's result, call 1's request
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnOrder},
	{Stage: "client", Op: "request", On: "tollgate.decide.cli.<approval>", Bytes: 150},                        // to the approver's service (pipeline/submit): in no stream
	{Stage: "approver", Op: "kv.update", On: "tollgate_approvals/<approval>", Bytes: 1025, Fact: factDecided}, // on the revision its watch delivered: the decision's revision is the decided event
	{Stage: "approver", Op: "answer", On: "tollgate.decide.cli.<approval>", Trigger: topology.SubjectDecide},
	{Stage: "redriver", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>.started", MsgID: true, Bytes: 1204}, // call 1 claimed, after the awaiting event its watch delivered
	{Stage: "redriver", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>.outcome", MsgID: true, Bytes: 1360}, // call 1's result and the outcome
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_approvals/redriver", Trigger: "fact:" + factDecided},
}

// rawSequence returns the raw sequence of p (a copy).
func rawSequence(p path) []step {
	if p == approvalPath {
		return append([]step(nil), rawApproval...)
	}
	return append([]step(nil), rawFast...)
}

// sameShape reports whether two sequences have the same operations in the
// same order (stage, operation, target, message id), sizes aside, and if
// not, the first difference.
func sameShape(traced, raw []step) (bool, string) {
	for i := 0; i < max(len(traced), len(raw)); i++ {
		switch {
		case i >= len(traced):
			return false, "trace ends before raw step " + raw[i].String()
		case i >= len(raw):
			return false, "trace has more steps: " + traced[i].String()
		}
		a, b := traced[i], raw[i]
		if a.Stage != b.Stage || a.Op != b.Op || a.On != b.On || a.MsgID != b.MsgID {
			return false, "step " + strconv.Itoa(i+1) + ": traced " + a.String() + ", raw " + b.String()
		}
	}
	return true, ""
}

// calibrate returns raw with the byte sizes of traced when both have the
// same shape.
func calibrate(raw, traced []step) []step {
	if ok, _ := sameShape(traced, raw); !ok {
		return raw
	}
	out := append([]step(nil), raw...)
	for i := range out {
		out[i].Bytes = traced[i].Bytes
	}
	return out
}

// The two designs of "one write per fact" (docs/bench.md, "One write per
// fact"), as raw turns for the layout phase. Neither is traced: no stage
// is built that way yet. Their byte sizes are today's, added up where a
// write now carries what two records carried (a batch record with its
// call's claim, say). Steps of their own:
//
//   - Fact on a write names the fact it makes durable; the raw stages send
//     it as a Bench-Fact header, and the batch record's state byte, which
//     a session-order read checks (ended: the outcome);
//   - a trigger "fact:<name>" runs a group for a change-stream message of
//     that fact (the stages consume the buckets' or the turn logs'
//     change streams, with subject filters, instead of event publishes);
//   - Pred on a stream.get is ingest's lookup of the session's previous
//     accepted turn, which it stamps on the turn (<pred>): the session's
//     order is the order of its accepted turns on their subject, so no
//     session record is written. The executor reads the predecessor's
//     state (<pred>, in its partition <pp>) and waits while it has not
//     ended: a read, not a write. A session's first turn has none;
//   - log.append (design b) appends an event to the turn's log, a
//     compare-and-set against the turn's last event
//     (Nats-Expected-Last-Subject-Sequence with
//     Nats-Expected-Last-Subject-Sequence-Subject set to the turn's
//     wildcard, tollgate.turnlog.<p>.<turn>.>);
//   - <p> is the turn's partition of the state writes: of P batch buckets
//     (a) or P turn-log streams (b), chosen by a hash of the turn id.
//
// Both designs keep the pending approvals in the one approvals bucket and
// the inbound messages, accepted turns and decision submits on their
// streams. Every compare-and-set write carries a message id, so that a
// retried write the server refuses (it checks the compare-and-set before
// the message id) is recognised as the writer's own (rawWriter.cas).

// Design (a), records are the log: each state transition is one KV write,
// a compare-and-set at the record's revision, and the redriver consumes
// the batch buckets' and the approvals bucket's change streams. The batch
// record carries its calls' claims and results and is created already
// running, with call 0 claimed; its completion is the outcome. Fast: 4
// writes.
var recordsFast = slices.Concat(designIngest(213, 665), []step{
	{Stage: "executor", Op: "kv.get", On: "tollgate_batches/<pred>"}, // session order
	{Stage: "executor", Op: "kv.create", On: "tollgate_batches/<turn>", Fact: factRunning, Bytes: 745 + 217},
	{Stage: "executor", Op: "kv.update", On: "tollgate_batches/<turn>", Fact: factOutcome, Bytes: 833 + 310},
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnAccepted},
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_batches_<p>/redriver", Trigger: "fact:" + factRunning},
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_batches_<p>/redriver", Trigger: "fact:" + factOutcome},
})

// recordsApproval: the approval turn in design (a), 9 writes. The executor
// runs call 0, then writes the batch awaiting (with call 0's result) and
// only then the pending approval, so that no decision can be applied
// before the batch awaits it (the other order lets a quick decider's
// resume race the executor's awaiting write). The redriver reaches the
// awaiting write before the approval's decided write: it reads the
// approval (not yet there, or pending), and on the decided write it reads
// the batch and resumes it at that revision.
var recordsApproval = slices.Concat(designIngest(273, 850), []step{
	{Stage: "executor", Op: "kv.get", On: "tollgate_batches/<pred>"}, // session order
	{Stage: "executor", Op: "kv.create", On: "tollgate_batches/<turn>", Fact: factRunning, Bytes: 932 + 217},
	{Stage: "executor", Op: "kv.get", On: "tollgate_grants/<grant-index>"},
	{Stage: "executor", Op: "kv.update", On: "tollgate_batches/<turn>", Fact: factAwaiting, Bytes: 1043 + 310},
	{Stage: "executor", Op: "kv.create", On: "tollgate_approvals/<approval>", Fact: factRequested, Bytes: 822},
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnAccepted},
}, designApprover, []step{
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_batches_<p>/redriver", Trigger: "fact:" + factRunning},
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_approvals/redriver", Trigger: "fact:" + factRequested},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_approvals/<approval>"}, // not there yet, or pending
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_batches_<p>/redriver", Trigger: "fact:" + factAwaiting},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_batches/<turn>"},
	{Stage: "redriver", Op: "kv.update", On: "tollgate_batches/<turn>", Fact: factStarted, Bytes: 1042 + 223},
	{Stage: "redriver", Op: "kv.update", On: "tollgate_batches/<turn>", Fact: factOutcome, Bytes: 1198 + 385},
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_approvals/redriver", Trigger: "fact:" + factDecided},
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_batches_<p>/redriver", Trigger: "fact:" + factStarted},
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_batches_<p>/redriver", Trigger: "fact:" + factOutcome},
})

// Design (b), the turn's events are the log: the executor and the
// redriver append the turn's events to its log (no batch record: the
// batch is the fold of its events), and the approvals stay a KV, whose
// change stream wakes the redriver. The accepted turn stays on its
// session's subject, which is the session's order. Fast: 4 writes.
var eventsFast = slices.Concat(designIngest(213, 665), []step{
	{Stage: "executor", Op: "stream.get", On: "TOLLGATE_TURNLOG_<pp> last tollgate.turnlog.<pp>.<pred>.>"}, // session order
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>." + factRunning, Fact: factRunning, Bytes: 217 + 89},
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>." + factOutcome, Fact: factOutcome, Bytes: 263 + 310},
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnAccepted},
})

// eventsApproval: the approval turn in design (b), 9 writes (the issue
// guessed about 8; see docs/bench.md for why none of the nine folds), in
// recordsApproval's order: the awaiting event before the approval.
var eventsApproval = slices.Concat(designIngest(273, 850), []step{
	{Stage: "executor", Op: "stream.get", On: "TOLLGATE_TURNLOG_<pp> last tollgate.turnlog.<pp>.<pred>.>"}, // session order
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>." + factRunning, Fact: factRunning, Bytes: 217 + 89},
	{Stage: "executor", Op: "kv.get", On: "tollgate_grants/<grant-index>"},
	{Stage: "executor", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>." + factAwaiting, Fact: factAwaiting, Bytes: 310 + 89},
	{Stage: "executor", Op: "kv.create", On: "tollgate_approvals/<approval>", Fact: factRequested, Bytes: 822},
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnAccepted},
}, designApprover, []step{
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_approvals/redriver", Trigger: "fact:" + factRequested},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_approvals/<approval>"}, // not there yet, or pending
	{Stage: "redriver", Op: "consume+ack", On: "TOLLGATE_TURNLOG_<p>/redriver", Trigger: "fact:" + factAwaiting},
	{Stage: "redriver", Op: "stream.get", On: "TOLLGATE_TURNLOG_<p> last tollgate.turnlog.<p>.<turn>.>"},
	{Stage: "redriver", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>." + factStarted, Fact: factStarted, Bytes: 223 + 89},
	{Stage: "redriver", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>." + factOutcome, Fact: factOutcome, Bytes: 418},
	{Stage: "redriver", Op: "consume+ack", On: "KV_tollgate_approvals/redriver", Trigger: "fact:" + factDecided},
})

// designIngest is the two designs' start of a turn, an inbound message of
// inbound bytes that ingest accepts as a turn of accepted bytes: ingest
// looks up the session's previous accepted turn and stamps it on the new
// one as its predecessor.
func designIngest(inbound, accepted int) []step {
	return []step{
		{Stage: "client", Op: "publish", On: "tollgate.inbound.cli.<session>", MsgID: true, Bytes: inbound},
		{Stage: "ingest", Op: "stream.get", On: "TOLLGATE_TURNS last tollgate.turn.accepted.<session>", Pred: true},
		{Stage: "ingest", Op: "publish", On: "tollgate.turn.accepted.<session>", MsgID: true, Bytes: accepted},
		{Stage: "ingest", Op: "consume+ack", On: "TOLLGATE_INBOUND/ingest", Trigger: topology.SubjectInboundPrefix},
	}
}

// designApprover is the two designs' decision: submitted, then applied to
// the approval by compare-and-set (the approval's decided write is the
// only record of it).
var designApprover = []step{
	{Stage: "client", Op: "publish", On: "tollgate.decision.submit.cli.<approval>", MsgID: true, Bytes: 150},
	{Stage: "approver", Op: "kv.get", On: "tollgate_approvals/<approval>"},
	{Stage: "approver", Op: "kv.update", On: "tollgate_approvals/<approval>", Fact: factDecided, Bytes: 924},
	{Stage: "approver", Op: "consume+ack", On: "TOLLGATE_DECISIONS/approver", Trigger: topology.SubjectDecisionSubmit},
}

// The facts the designs' writes make durable (step.Fact).
const (
	factRunning   = "running"   // the batch, running, call 0 claimed
	factRequested = "requested" // the approval, pending
	factAwaiting  = "awaiting"  // the batch awaits its approval; call 0's result
	factDecided   = "decided"   // the approval, decided
	factStarted   = "started"   // the batch resumed, call 1 claimed
	factOutcome   = "outcome"   // the batch completed: the last call's result and the turn's outcome
)
