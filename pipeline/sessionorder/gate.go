package sessionorder

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Gate is the session-order rule where a turn joins its session's order
// (docs/protocol.md §5.4): ingest asks it before it appends a turn, so
// that a session's order is the order its inbound messages arrived in,
// however many ingest replicas take them and whatever order their
// redeliveries come in.
//
// The order's last entry carries the session's arrival watermark
// (jetstream/turnorder, Entry.Arrival): every inbound message of the
// session up to it is in the order, or was passed over. A turn whose
// inbound sequence is above the watermark joins only when each inbound
// message of its session between the two is settled:
//
//   - ingest's admission rule (policy.(*Policy).Admit, deterministic for
//     a given policy) refuses it: it never becomes a turn; or
//   - it is the same turn (a transport's retry of the message under
//     another message id); or
//   - it was stored longer than the wait ago (GateConfig.Wait): a message
//     ingest gave up on for a reason that is not deterministic (a panic,
//     retries exhausted) must not hold its session back for good. Where
//     the session's order has entries, this is logged and counted
//     (tollgate_session_order_skipped_total); a session with none yet
//     (new, or whose turns an earlier version accepted outside the
//     order) passes its old messages over silently: the earlier version
//     ran them.
//
// Otherwise Check returns an *OutOfOrder (a runner.Waiting error: the
// message is NAKed and tried again shortly), and the earlier message joins
// first. Follow-up turns (Origin set) and contexts without an inbound
// sequence are not ordered by arrival: Check passes them.
//
// A stale watermark (an entry another replica appended since the caller
// read it) only makes the check stricter; a caller that is told to wait
// reads the session's last entry afresh before it asks again.
//
// The walk starts at the acknowledgement floor of the consumer that takes
// inbound messages into the order (GateConfig.Consumer) where that is
// above the watermark: every inbound message at or below the floor was
// acknowledged by ingest, whichever replica took it, so it joined the
// order already (an append is durable before its message is acknowledged)
// or it never will (refused, or given up on and dead-lettered). Without
// the floor the server walks, one by one, every message of every other
// session stored between the watermark and the turn (a block's
// per-subject index knows a subject's first and last message, not what
// lies between), up to a file-store block's worth per turn on a busy
// stream; with it, about the messages ingest holds unacknowledged. The
// floor is read (a consumer info request) at most once per floorEvery,
// and only for a walk longer than floorGap; a stale floor is lower, so it
// only walks more. A message given up on therefore stops holding its
// session once the floor passes it, not after the order wait. Where the
// floor cannot be read (no such consumer, no permission), the walk starts
// at the watermark, as without it.
type Gate struct {
	rule  *rule
	floor *ackFloor // nil: the walk starts at the watermark
}

// GateConfig wires a Gate.
type GateConfig struct {
	JS     jetstream.JetStream
	Policy *policy.Policy // the admission rule is evaluated under it
	Now    func() time.Time
	Logger *slog.Logger
	// Registerer gets tollgate_session_order_skipped_total (shared with
	// every Checker and Gate registered on it); nil registers nothing.
	Registerer prometheus.Registerer
	// Wait is how long an earlier inbound message that is not in the
	// order holds later ones back (default DefaultWait).
	Wait time.Duration
	// Consumer is the durable consumer of TOLLGATE_INBOUND that takes
	// inbound messages into the order (topology.ConsumerIngest): its
	// acknowledgement floor bounds the check's walk (Gate). Empty: the
	// walk starts at the watermark.
	Consumer string
}

// NewGate returns a Gate.
func NewGate(cfg GateConfig) (*Gate, error) {
	if cfg.JS == nil || cfg.Policy == nil || cfg.Now == nil || cfg.Logger == nil {
		return nil, errors.New("sessionorder: JS, Policy, Now and Logger are required")
	}
	r, err := newRule(cfg.JS, cfg.Policy, cfg.Now, cfg.Logger, cfg.Registerer, cfg.Wait)
	if err != nil {
		return nil, err
	}
	g := &Gate{rule: r}
	if cfg.Consumer != "" {
		g.floor = &ackFloor{js: cfg.JS, consumer: cfg.Consumer, now: cfg.Now, logger: cfg.Logger}
	}
	return g, nil
}

// Check returns nil when t may join its session's order after an entry
// whose arrival watermark is watermark, an *OutOfOrder when an earlier
// inbound message of the session must join first, or another error when
// the lookups fail. Nothing but the order wait settles an admitted
// message of another turn: ingest alone appends, in this order.
func (g *Gate) Check(ctx context.Context, t *schemas.AcceptedTurn, watermark uint64) error {
	seq := arrivalOf(t)
	if seq == 0 || watermark+1 >= seq {
		return nil
	}
	from := watermark
	if g.floor != nil && seq-watermark > floorGap {
		from = max(from, g.floor.get(ctx))
		if from+1 >= seq {
			return nil
		}
	}
	// A session whose order has no entries yet passes its old messages
	// over silently: an earlier version ran them.
	return g.rule.check(ctx, t.TurnID, t.Context, from, seq, watermark > 0, nil)
}

// Earliest reports whether t's inbound message is the first of its
// session that TOLLGATE_INBOUND keeps: no inbound message of the session
// is stored before it, so nothing can be waited for, and Check passes t
// whatever the watermark. Ingest asks it for a session it does not
// remember, before reading the session's order: a new session's turn then
// reads nothing else (turnorder.Writer.AssumeNew). A turn that is not
// ordered by arrival (a follow-up, or a context without an inbound
// sequence) is never the earliest: Check passes it anyway, and the order
// is read for it as before.
func (g *Gate) Earliest(ctx context.Context, t *schemas.AcceptedTurn) (bool, error) {
	seq := arrivalOf(t)
	if seq == 0 {
		return false, nil
	}
	return g.rule.earliest(ctx, t.Context, seq)
}

const (
	// floorEvery is how often, at most, a Gate reads its consumer's
	// acknowledgement floor: at 2,000 turns/s a floor this old is some 20
	// messages behind, against the hundreds to thousands a walk from the
	// watermark passes under load.
	floorEvery = 10 * time.Millisecond
	// floorGap is the shortest walk (in stream sequences) worth a floor
	// read: the server passes a few dozen messages in less time than a
	// consumer info request takes.
	floorGap = 64
)

// ackFloor is the acknowledgement floor of a consumer of TOLLGATE_INBOUND,
// read at most once per floorEvery: get returns the last floor read
// (0 before the first) and, when it is older than that, reads it first,
// one caller at a time (the others take the floor as it is). A failed
// read keeps the floor it had (acknowledged messages stay acknowledged)
// and is tried again floorEvery later.
type ackFloor struct {
	js       jetstream.JetStream
	consumer string
	now      func() time.Time
	logger   *slog.Logger

	mu      sync.Mutex
	c       jetstream.Consumer
	seq     uint64
	read    time.Time
	reading bool
}

func (f *ackFloor) get(ctx context.Context) uint64 {
	f.mu.Lock()
	if f.reading || (!f.read.IsZero() && f.now().Sub(f.read) < floorEvery) {
		seq := f.seq
		f.mu.Unlock()
		return seq
	}
	f.reading = true
	c := f.c
	f.mu.Unlock()

	var (
		info *jetstream.ConsumerInfo
		err  error
	)
	if c == nil {
		c, err = f.js.Consumer(ctx, topology.StreamInbound, f.consumer)
		if err == nil {
			info = c.CachedInfo()
		}
	} else {
		info, err = c.Info(ctx)
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	f.reading, f.read = false, f.now()
	if err != nil {
		f.logger.Debug("session order: reading the inbound consumer's acknowledgement floor", "consumer", f.consumer, "error", err)
		return f.seq
	}
	// A consumer made again starts its floor afresh, lower: what it had
	// acknowledged stays settled, but the floor read is the one to trust.
	f.c, f.seq = c, info.AckFloor.Stream
	return f.seq
}

// arrivalOf is the inbound sequence that orders accepted turn t in its
// session, or 0 for a turn not ordered by arrival (a follow-up, or a
// context without an inbound sequence): ArrivalSeq's twin for a turn that
// has no batch yet.
func arrivalOf(t *schemas.AcceptedTurn) uint64 {
	if t.Origin != "" || t.Context == nil {
		return 0
	}
	return t.Context.Provenance.StreamSeq
}
