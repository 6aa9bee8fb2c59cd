// Package sessionorder is the rule that makes the turns of one session run
// in the order their inbound messages arrived, whichever stage starts
// them: the executor for turns with calls, the planner for agent loops.
//
// The turns of one session must run in the order their inbound messages
// arrived, that is in TOLLGATE_INBOUND stream-sequence order, one at a
// time. Nothing about the consumers guarantees that once stages are scaled:
// two ingest replicas can publish a session's accepted turns out of arrival
// order, two executor replicas can take two accepted turns of one session
// at once, the executor and the planner consume different subjects, and a
// NAK or a redelivery after a crash or broker restart lets a later message
// overtake an earlier one even inside one process.
//
// So the order is enforced on the data, not on delivery. Inbound subjects
// end in the session key (topology.InboundSubject), and the session record
// (schemas.SessionRecord, one per session, shared by the executor and the
// planner) keeps a watermark, InboundSeq: every inbound message of the
// session up to it is already queued, running or finished. Before a turn
// joins its session's queue (batch.Engine.Acquire), Checker.Check looks up
// the session's inbound messages between the watermark and the turn's own
// (one stream message get per earlier message, normally none or one) and
// lets the turn in only if each of them is settled:
//
//   - its turn is the session's active turn or already queued, or its batch
//     record has left the queued state (running, waiting, finished); or
//   - it can never become a turn: ingest's admission rule,
//     policy.(*Policy).Admit, refuses it (it does not decode, arrived on the wrong subject, or its
//     calls are invalid; Admit is deterministic for a given policy); or
//   - it has waited longer than Checker.Wait (a message ingest gave up on
//     for a non-deterministic reason, such as a panic or retries exhausted,
//     must not block its session forever). This is logged and counted as
//     tollgate_session_order_skipped_total.
//
// Otherwise Check returns an *OutOfOrder error (a runner.Waiting error: the
// message is NAKed and tried again shortly) and the earlier turn gets in
// first. Acquire then raises the watermark to the turn's sequence in the
// same compare-and-set that queues it. Because "settled" never reverts,
// checking before the compare-and-set is enough.
//
// A turn of either kind has its batch record (queued) before it joins the
// queue: the executor creates it from the accepted turn, the planner when it
// records the planner turn (schemas.BatchRecord.Plan). So "queued batch
// record, not in the session record" means "about to join the queue", for
// both.
//
// Follow-up turns (Origin set: a tool's follow-up call or a step of an
// agent loop) carry their submitting turn's context and so its inbound
// sequence; they are not arrival-ordered messages and skip the check, as do
// contexts without an inbound sequence.
//
// Today the rule's main use is earlier, by Gate, where ingest appends a
// turn to its session's order (docs/protocol.md §5.4), against the
// watermark the order's last entry carries: the order is then arrival
// order, and the order alone decides when a turn runs (batch.Engine.ItsTurn,
// docs/protocol.md §1.4). The Checker serves the turns that are not
// entries yet: a turn an earlier version's ingest accepted on the accepted
// subject, checked before the executor appends it to the order, and a
// batch an earlier version queued, checked before it takes its session
// record's queue.
package sessionorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// DefaultWait bounds how long a turn waits for an earlier inbound message
// of its session that ingest has not turned into a turn.
const DefaultWait = 2 * time.Minute

// Retry is how soon a turn that waits for an earlier one looks again.
const Retry = 250 * time.Millisecond

// OutOfOrder is a runner.Waiting error: the runner NAKs the message and it
// is tried again after the earlier turn had its chance.
type OutOfOrder struct {
	Turn    string
	Seq     uint64
	Earlier uint64
}

// RetryAfter implements runner.Waiting: the earlier turn normally arrives
// within milliseconds, and the wait is bounded by Checker.Wait, not by the
// runner's attempt count.
func (e *OutOfOrder) RetryAfter() time.Duration { return Retry }

func (e *OutOfOrder) Error() string {
	return fmt.Sprintf("turn %s (inbound seq %d) waits for its session's earlier inbound message at seq %d", e.Turn, e.Seq, e.Earlier)
}

// Config wires a Checker.
type Config struct {
	JS     jetstream.JetStream
	Store  *store.Store
	Policy *policy.Policy // ingest's admission rule is evaluated under it
	Now    func() time.Time
	Logger *slog.Logger
	// Registerer gets tollgate_session_order_skipped_total (shared by every
	// checker registered on it); nil registers nothing.
	Registerer prometheus.Registerer
	// Wait is how long an earlier inbound message that is not a turn yet
	// holds later ones back (default DefaultWait).
	Wait time.Duration
}

// Checker applies the session-order rule (see the package doc).
type Checker struct {
	cfg  Config
	rule *rule
}

// New returns a Checker.
func New(cfg Config) (*Checker, error) {
	if cfg.JS == nil || cfg.Store == nil || cfg.Policy == nil || cfg.Now == nil || cfg.Logger == nil {
		return nil, errors.New("sessionorder: JS, Store, Policy, Now and Logger are required")
	}
	r, err := newRule(cfg.JS, cfg.Policy, cfg.Now, cfg.Logger, cfg.Registerer, cfg.Wait)
	if err != nil {
		return nil, err
	}
	return &Checker{cfg: cfg, rule: r}, nil
}

// ArrivalSeq is the inbound sequence that orders b in its session, or 0
// for a turn that is not arrival-ordered (a follow-up).
func ArrivalSeq(b *schemas.BatchRecord) uint64 {
	if b.Origin != "" || b.Context == nil {
		return 0
	}
	return b.Context.Provenance.StreamSeq
}

// Check returns nil when every earlier inbound message of b's session is
// settled, an *OutOfOrder when one is not yet, or another error when the
// lookups fail. With a nil error it also returns the session record it
// read, for batch.Engine.Acquire (nil for a turn it did not check).
func (c *Checker) Check(ctx context.Context, b *schemas.BatchRecord) (*batch.SessionSnapshot, error) {
	seq := ArrivalSeq(b)
	if seq == 0 {
		return nil, nil
	}
	key := schemas.SessionKeyOf(b.Context)
	sess, rev, err := c.cfg.Store.Sessions.Get(ctx, key)
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
	err = c.rule.check(ctx, b.TurnID, b.Context, sess.InboundSeq, seq, true, func(turn string) (verdict, error) {
		return c.placed(ctx, sess, turn)
	})
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// placed is the Checker's verdict on turn, the turn an earlier inbound
// message of session sess becomes: settled when the session record has
// it active or queued, or its batch has left queued; waiting while its
// batch is queued and not in the record (its stage is between creating
// the batch and queuing it, or the record read is older than its
// queuing: either way it comes first, however long that takes);
// undecided when it has no batch yet (ingest has not accepted it, or its
// stage has not seen it: the order wait bounds that).
func (c *Checker) placed(ctx context.Context, sess *schemas.SessionRecord, turn string) (verdict, error) {
	if sess.Active == turn || slices.Contains(sess.Queue, turn) {
		return settled, nil
	}
	b, _, err := c.cfg.Store.Batches.Get(ctx, turn)
	switch {
	case err == nil && b.State == schemas.BatchQueued:
		return waits, nil
	case err == nil:
		return settled, nil
	case schemas.Permanent(err):
		return settled, nil // an undecodable batch is dead-lettered, never run
	case !errors.Is(err, store.ErrNotFound):
		return undecided, fmt.Errorf("session order: load batch %s: %w", turn, err)
	}
	return undecided, nil
}
