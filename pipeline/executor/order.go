package executor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Session order.
//
// The turns of one session must run in the order their inbound messages
// arrived, that is in TOLLGATE_INBOUND stream-sequence order, one batch at a
// time. Nothing about the consumers guarantees that once stages are scaled:
// two ingest replicas can publish a session's accepted turns out of arrival
// order, two executor replicas can take two accepted turns of one session
// at once, and a NAK or a redelivery after a crash or broker restart lets a
// later message overtake an earlier one even inside one process.
//
// So the order is enforced on the data, not on delivery. Inbound subjects
// end in the session key (topology.InboundSubject), and the session record
// keeps a watermark, InboundSeq: every inbound message of the session up to
// it is already queued, running or finished. Before a turn joins its
// session's queue, inOrder looks up the session's inbound messages between
// the watermark and the turn's own (one stream message get per earlier
// message, normally none or one) and lets the turn in only if each of them
// is settled:
//
//   - its turn is the session's active turn or already queued, or its batch
//     has left the queued state (running, waiting, finished); or
//   - it can never become a turn: ingest's admission rule, ingest.Admit,
//     refuses it (it does not decode, arrived on the wrong subject, or its
//     calls are invalid; Admit is deterministic for a given policy); or
//   - it has waited longer than Config.OrderWait (a message ingest gave up
//     on for a non-deterministic reason, such as a panic or retries
//     exhausted, must not block its session forever). This is logged and
//     counted as tollgate_session_order_skipped_total.
//
// Otherwise the turn's message is NAKed (a transient error) and tried again
// shortly: the earlier turn gets in first. Acquire then raises the watermark
// to the turn's sequence in the same compare-and-set that queues it. Because
// "settled" never reverts, checking before the compare-and-set is enough.
//
// Follow-up turns (Origin set) carry their submitting turn's context and so
// its inbound sequence; they are not arrival-ordered messages and skip the
// check, as do contexts without an inbound sequence.

// DefaultOrderWait bounds how long a turn waits for an earlier inbound
// message of its session that ingest has not turned into a turn.
const DefaultOrderWait = 2 * time.Minute

// errOutOfOrder is a runner.Waiting error: the runner NAKs the message and
// it is tried again after the earlier turn had its chance.
type errOutOfOrder struct {
	turn    string
	seq     uint64
	earlier uint64
}

// RetryAfter implements runner.Waiting: the earlier turn normally arrives
// within milliseconds, and the wait is bounded by OrderWait, not by the
// runner's attempt count.
func (e *errOutOfOrder) RetryAfter() time.Duration { return orderRetry }

// orderRetry is how soon a turn that waits for an earlier one looks again.
const orderRetry = 250 * time.Millisecond

func (e *errOutOfOrder) Error() string {
	return fmt.Sprintf("turn %s (inbound seq %d) waits for its session's earlier inbound message at seq %d", e.turn, e.seq, e.earlier)
}

// inboundStream returns the TOLLGATE_INBOUND handle, looked up once.
func (x *Executor) inboundStream(ctx context.Context) (jetstream.Stream, error) {
	x.inboundMu.Lock()
	defer x.inboundMu.Unlock()
	if x.inbound != nil {
		return x.inbound, nil
	}
	s, err := x.cfg.JS.Stream(ctx, topology.StreamInbound)
	if err != nil {
		return nil, fmt.Errorf("session order: stream %s: %w", topology.StreamInbound, err)
	}
	x.inbound = s
	return s, nil
}

// orderState is the per-executor state of the session-order check.
type orderState struct {
	inboundMu sync.Mutex
	inbound   jetstream.Stream
}

// inOrder returns nil when every earlier inbound message of b's session is
// settled (see above), an *errOutOfOrder when one is not yet, or another
// error when the lookups fail. With a nil error it also returns the session
// record it read, for Acquire (nil for a turn it did not check).
func (x *Executor) inOrder(ctx context.Context, b *schemas.BatchRecord) (*batch.SessionSnapshot, error) {
	if b.Origin != "" || b.Context == nil || b.Context.Provenance.StreamSeq == 0 {
		return nil, nil
	}
	seq := b.Context.Provenance.StreamSeq
	key := schemas.SessionKey(b.SessionID)
	sess, rev, err := x.cfg.Store.Sessions.Get(ctx, key)
	snap := &batch.SessionSnapshot{Rec: sess, Rev: rev}
	switch {
	case errors.Is(err, store.ErrNotFound):
		sess, snap = &schemas.SessionRecord{}, &batch.SessionSnapshot{NotFound: true}
	case err != nil:
		return nil, fmt.Errorf("session order: load session %s: %w", key, err)
	}
	if sess.InboundSeq >= seq-1 {
		return snap, nil
	}
	stream, err := x.inboundStream(ctx)
	if err != nil {
		return nil, err
	}
	filter := topology.InboundSessionFilter(key)
	for from := sess.InboundSeq + 1; from < seq; {
		m, err := stream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return snap, nil
		}
		if err != nil {
			return nil, fmt.Errorf("session order: next inbound message of %s after %d: %w", key, from-1, err)
		}
		if m.Sequence >= seq {
			return snap, nil
		}
		settled, err := x.settled(ctx, b.TurnID, sess, m)
		if err != nil {
			return nil, err
		}
		if !settled {
			return nil, &errOutOfOrder{turn: b.TurnID, seq: seq, earlier: m.Sequence}
		}
		from = m.Sequence + 1
	}
	return snap, nil
}

// settled reports whether the earlier inbound message m of session sess
// can no longer become a turn that should run before turn self.
func (x *Executor) settled(ctx context.Context, self string, sess *schemas.SessionRecord, m *jetstream.RawStreamMsg) (bool, error) {
	// Admit is deterministic for a given policy: a message it refuses is
	// dead-lettered by ingest and never becomes a turn.
	t, err := ingest.Admit(m.Subject, m.Data, x.cfg.Policy, schemas.Provenance{StreamSeq: m.Sequence, ReceivedAt: m.Time})
	if err != nil {
		return true, nil
	}
	turn := t.TurnID
	if turn == self {
		// An earlier delivery of the same transport message (a transport
		// retry under another Nats-Msg-Id): one turn, already this one.
		return true, nil
	}
	if sess.Active == turn || slices.Contains(sess.Queue, turn) {
		return true, nil
	}
	b, _, err := x.cfg.Store.Batches.Get(ctx, turn)
	switch {
	case err == nil:
		// Queued but not in the session record: its executor is between
		// creating the batch and queuing it (or the record we read is
		// older than its queuing). Either way it comes first.
		return b.State != schemas.BatchQueued, nil
	case schemas.Permanent(err):
		return true, nil // an undecodable batch is dead-lettered, never run
	case !errors.Is(err, store.ErrNotFound):
		return false, fmt.Errorf("session order: load batch %s: %w", turn, err)
	}
	// No batch yet: ingest has not accepted it, or the executor has not
	// seen the accepted turn. Wait, for a while.
	if age := x.cfg.Engine.Now().Sub(m.Time); age > x.cfg.OrderWait {
		x.orderSkipped.Inc()
		x.cfg.Logger.Warn("session order: an earlier inbound message never became a turn; letting later turns pass it",
			"session", sess.SessionID, "inbound_seq", m.Sequence, "turn", turn, "waited", age)
		return true, nil
	}
	return false, nil
}
