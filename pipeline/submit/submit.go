// Package submit sends a person's decision on an approval (or a standing
// grant's revocation) to the approver.
//
// Decision sends it as a core NATS request on
// tollgate.decide.<transport>.<approval id> (topology.DecideSubject),
// which the approver answers once it has handled it: applied by its
// compare-and-set on the approval record (that revision is the decision's
// one durable write), counted as a vote, found to repeat the recorded
// decision, or rejected with a reason code (bad input dead-lettered). What
// the approver does not finish at once (a transient failure, a grant's
// revocation) it hands back (NotTaken), and when no approver answers
// (none runs, or none within the timeout) there is no answer at all: in
// both cases Decision stores the decision on TOLLGATE_DECISIONS
// (tollgate.decision.submit.<transport>.<approval id>, message id its
// decision id), where the approver's consumer handles it later. Either
// way the decision is handled once: a decision applied by a request whose
// answer was lost, and then stored on the stream, is found there to repeat
// the recorded decision (an idempotent success, answered as every repeat
// is), and the stream keeps one copy of a decision stored twice within its
// duplicate window.
//
// Storing it is retried until the stream acknowledges it or the caller's
// context ends: each attempt is bounded (5 s), because on a
// cluster a publish that reaches a stream leader as it loses its
// leadership, or a replica cut off from its peers, can be dropped without
// any answer, and waiting for that answer until the caller's deadline
// would lose the decision (the chaos cluster test found it). The message
// id makes the attempts one message.
//
// The wire contract is docs/protocol.md §9.2.
package submit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

// HeaderResult is the header of the approver's answer that names what a
// decision did (a Result), on an answer that is not an error.
const HeaderResult = "Tollgate-Result"

// NotTaken is the error code (micro's Nats-Service-Error-Code) of an
// answer that hands the decision back: the sender stores it on the
// stream, as when no approver answers.
const NotTaken = "503"

// Result is what a submitted decision did.
type Result string

const (
	// Applied: the approval record holds the decision (its
	// compare-and-set).
	Applied Result = "applied"
	// Vote: counted as one vote of a quorum; more are needed.
	Vote Result = "vote"
	// Idempotent: it repeats the decision the record holds (by its
	// decider or another authorized one, or the same decision again).
	Idempotent Result = "idempotent"
	// Rejected: refused with a reason code (Answer.Code); the rejection
	// is also published on tollgate.event.decision.rejected.<approval>.
	Rejected Result = "rejected"
	// Queued: stored on TOLLGATE_DECISIONS by Decision (no approver
	// answered, or it handed the decision back), where the approver's
	// consumer handles it: its outcome is heard as a stream-submitted
	// decision's is (the approval's decided revision, or a rejection
	// event).
	Queued Result = "queued"
)

// Answer is the approver's answer to a decision.
type Answer struct {
	Result Result
	// Code and Reason say why a decision was Rejected.
	Code   schemas.Code
	Reason string
	// Stored is TOLLGATE_DECISIONS' acknowledgement of a Queued decision:
	// its sequence there, or for a decision id stored before within the
	// duplicate window, Duplicate and the first copy's sequence.
	Stored *jetstream.PubAck
}

// DefaultTimeout is how long Decision waits for the approver's answer
// (less when ctx's deadline is sooner) before it stores the decision on
// the stream.
const DefaultTimeout = 5 * time.Second

// Decision submits d (see the package doc). Its error is only for a
// decision neither answered nor stored on the stream (it did not reach
// Tollgate: the sender may send it again, with the same decision id), or
// for one that does not encode.
func Decision(ctx context.Context, js jetstream.JetStream, d *schemas.Decision) (Answer, error) {
	data, err := schemas.Encode(d)
	if err != nil {
		return Answer{}, fmt.Errorf("submit decision %s: %w", d.DecisionID, err)
	}
	rctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	reply, err := js.Conn().RequestWithContext(rctx, topology.DecideSubject(d.Transport, d.ApprovalID), data)
	if err == nil {
		if a, ok := answerOf(reply); ok {
			return a, nil
		}
	} else if ctx.Err() != nil {
		return Answer{}, fmt.Errorf("submit decision %s: %w", d.DecisionID, ctx.Err())
	} else if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
		return Answer{}, fmt.Errorf("submit decision %s: %w", d.DecisionID, err)
	}
	// No answer, or "not taken": the stream keeps it for the approver.
	ack, err := bus.Store(ctx, js, topology.DecisionSubject(d.Transport, d.ApprovalID), topology.DecisionMsgID(d.DecisionID), data, nil,
		bus.WithAttemptTimeout(storeAttemptTimeout))
	if err != nil {
		return Answer{}, fmt.Errorf("submit decision %s: %w", d.DecisionID, err)
	}
	return Answer{Result: Queued, Stored: ack}, nil
}

// storeAttemptTimeout bounds one attempt to store a decision on the
// stream (a variable for tests).
var storeAttemptTimeout = bus.DefaultAttemptTimeout

// answerOf reads the approver's answer; false for one handed back
// (NotTaken) or one that says nothing Decision knows (stored on the
// stream all the same: the consumer handles it once).
func answerOf(m *nats.Msg) (Answer, bool) {
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		if code == NotTaken {
			return Answer{}, false
		}
		return Answer{Result: Rejected, Code: schemas.Code(code), Reason: m.Header.Get(micro.ErrorHeader)}, true
	}
	switch r := Result(m.Header.Get(HeaderResult)); r {
	case Applied, Vote, Idempotent:
		return Answer{Result: r}, true
	}
	return Answer{}, false
}
