package bench

import (
	"strconv"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// The raw turns: the JetStream operations one Tollgate turn performs, in
// order, as traced from the real stages (traceTurn) for the second turn of
// a session (the session's record exists and is free), another session's
// turn between the two. Placeholders:
// <turn> the turn id, <session> the session key, <approval> the approval id
// of the call that needs one. Byte sizes are those of the built-in
// policy's turns; each run replaces them with the traced sizes when the
// trace has the same shape (see calibrate).
//
// The executor reads the session record (for the session-order check, see
// pipeline/sessionorder) and queues the turn by compare-and-set at
// that revision. On a session's first turn the read finds nothing and the
// record is created instead, in Tollgate (Acquire) as in the raw program.
// Between the session record's read and its update, the executor looks up
// the session's first inbound message after the record's watermark (one
// stream message get with a subject filter): under load a session's
// previous turn is rarely the inbound message just before, and the trace
// puts another session's turn between the two it runs, so the traced turn
// does this lookup as the loaded pipeline does. (A turn whose previous
// inbound message is its session's own skips it; the bench's sessions
// rarely take that path.)
//
// Before the outcome, the stage that ends the batch retires the turn's
// claims and approvals (batch.Engine's retire): each is read, and written
// again with a TTL only if it has none. Today none needs it: a claim's
// retention started when its result was written, an approval's when it
// was decided (both with the TTL), so retire costs reads, not writes.
//
// sessionRecordBytes is the size of a new session record.
// Before it creates an approval, the executor looks up the standing grants
// of the call's tool and requester (one read of their grant index, which
// finds none in the bench: pipeline/grants).
//
// Besides these, Tollgate's approver watches the approvals bucket and its
// redriver the batches bucket (KV watches: ordered push consumers that
// receive every write, for the pending set and expiry, and for the
// recovery sweep); the raw approver and redriver run the same watches and
// discard what they receive.

const sessionRecordBytes = 89

// rawFast: one echo call, run at once.
var rawFast = []step{
	{Stage: "client", Op: "publish", On: "tollgate.inbound.cli.<session>", MsgID: true, Bytes: 213},
	{Stage: "ingest", Op: "publish", On: "tollgate.turn.accepted.<session>", MsgID: true, Bytes: 665},
	{Stage: "ingest", Op: "consume+ack", On: "TOLLGATE_INBOUND/ingest", Trigger: topology.SubjectInboundPrefix},
	{Stage: "executor", Op: "kv.create", On: "tollgate_batches/<turn>", Bytes: 745},
	{Stage: "executor", Op: "kv.get", On: "tollgate_sessions/<session>"},
	{Stage: "executor", Op: "stream.get", On: "TOLLGATE_INBOUND next tollgate.inbound.cli.<session>"},
	{Stage: "executor", Op: "kv.update", On: "tollgate_sessions/<session>", Bytes: 89},
	{Stage: "executor", Op: "kv.update", On: "tollgate_batches/<turn>", Bytes: 746},
	{Stage: "executor", Op: "kv.create", On: "tollgate_claims/<turn>-0", Bytes: 217},
	{Stage: "executor", Op: "kv.update", On: "tollgate_claims/<turn>-0", Bytes: 310},
	{Stage: "executor", Op: "kv.update", On: "tollgate_batches/<turn>", Bytes: 833},
	{Stage: "executor", Op: "kv.get", On: "tollgate_claims/<turn>-0"},
	{Stage: "executor", Op: "publish", On: "tollgate.event.turn.outcome.<turn>", MsgID: true, Bytes: 263},
	{Stage: "executor", Op: "kv.update", On: "tollgate_sessions/<session>", Bytes: 67},
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnAccepted},
}

// rawApproval: an echo call (run at once) and a write_file call (needs
// approval, approved by the decider), in the order that dominates under
// load: the decider answers the request, and the approver applies the
// decision, before the redriver gets to the batch-awaiting notice. The
// redriver then starts and completes the batch on the awaiting notice, and
// on the decided event finds it completed (Finish: it looks up the stored
// outcome instead of publishing it again, and the session release finds
// the session already released). At low load the redriver usually sees the
// awaiting notice first: a deferred evaluation (get batch, get approval,
// publish deferred) instead of the last group's three operations, and
// the start moves to the decided event (the report shows that trace too).
var rawApproval = []step{
	{Stage: "client", Op: "publish", On: "tollgate.inbound.cli.<session>", MsgID: true, Bytes: 273},
	{Stage: "ingest", Op: "publish", On: "tollgate.turn.accepted.<session>", MsgID: true, Bytes: 850},
	{Stage: "ingest", Op: "consume+ack", On: "TOLLGATE_INBOUND/ingest", Trigger: topology.SubjectInboundPrefix},
	{Stage: "executor", Op: "kv.create", On: "tollgate_batches/<turn>", Bytes: 932},
	{Stage: "executor", Op: "kv.get", On: "tollgate_sessions/<session>"},
	{Stage: "executor", Op: "stream.get", On: "TOLLGATE_INBOUND next tollgate.inbound.cli.<session>"},
	{Stage: "executor", Op: "kv.update", On: "tollgate_sessions/<session>", Bytes: 89},
	{Stage: "executor", Op: "kv.update", On: "tollgate_batches/<turn>", Bytes: 933},
	{Stage: "executor", Op: "kv.create", On: "tollgate_claims/<turn>-0", Bytes: 217},
	{Stage: "executor", Op: "kv.update", On: "tollgate_claims/<turn>-0", Bytes: 310},
	{Stage: "executor", Op: "kv.get", On: "tollgate_grants/<grant-index>"}, // no standing grant covers it
	{Stage: "executor", Op: "kv.create", On: "tollgate_approvals/<approval>", Bytes: 822},
	{Stage: "executor", Op: "publish", On: "tollgate.event.approval.requested.<turn>", MsgID: true, Bytes: 822},
	{Stage: "executor", Op: "kv.update", On: "tollgate_batches/<turn>", Bytes: 1043},
	{Stage: "executor", Op: "publish", On: "tollgate.event.batch.awaiting.<turn>", MsgID: true, Bytes: 89},
	{Stage: "executor", Op: "consume+ack", On: "TOLLGATE_TURNS/executor", Trigger: topology.SubjectTurnAccepted},
	{Stage: "client", Op: "publish", On: "tollgate.decision.submit.cli.<approval>", MsgID: true, Bytes: 150},
	{Stage: "approver", Op: "kv.get", On: "tollgate_approvals/<approval>"},
	{Stage: "approver", Op: "kv.update", On: "tollgate_approvals/<approval>", Bytes: 924},
	{Stage: "approver", Op: "publish", On: "tollgate.event.approval.decided.<turn>", MsgID: true, Bytes: 227},
	{Stage: "approver", Op: "consume+ack", On: "TOLLGATE_DECISIONS/approver", Trigger: topology.SubjectDecisionSubmit},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_batches/<turn>"},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_approvals/<approval>"},
	{Stage: "redriver", Op: "kv.update", On: "tollgate_batches/<turn>", Bytes: 1042},
	{Stage: "redriver", Op: "publish", On: "tollgate.event.redrive.started.<turn>", MsgID: true, Bytes: 89, Async: true},
	{Stage: "redriver", Op: "kv.create", On: "tollgate_claims/<turn>-1", Bytes: 223},
	{Stage: "redriver", Op: "kv.update", On: "tollgate_claims/<turn>-1", Bytes: 385},
	{Stage: "redriver", Op: "kv.update", On: "tollgate_batches/<turn>", Bytes: 1198},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_claims/<turn>-0"},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_approvals/<approval>"},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_claims/<turn>-1"},
	{Stage: "redriver", Op: "publish", On: "tollgate.event.turn.outcome.<turn>", MsgID: true, Bytes: 418},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_sessions/<session>"},
	{Stage: "redriver", Op: "kv.update", On: "tollgate_sessions/<session>", Bytes: 67},
	{Stage: "redriver", Op: "consume+ack", On: "TOLLGATE_EVENTS/redriver", Trigger: topology.SubjectBatchAwaiting},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_batches/<turn>"},
	{Stage: "redriver", Op: "stream.get", On: "TOLLGATE_EVENTS last tollgate.event.turn.outcome.<turn>"},
	{Stage: "redriver", Op: "kv.get", On: "tollgate_sessions/<session>"},
	{Stage: "redriver", Op: "consume+ack", On: "TOLLGATE_EVENTS/redriver", Trigger: topology.SubjectApprovalDecided},
}

// The redriver publishes the started event without waiting for its
// acknowledgement (Async), and waits for it before the batch's completion
// write; the raw redriver waits for it before its next publish or its ack,
// which is no later in practice (the claim's two writes come between).

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
