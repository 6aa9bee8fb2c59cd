package sessionorder

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

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
type Gate struct {
	rule *rule
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
	return &Gate{rule: r}, nil
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
	// A session whose order has no entries yet passes its old messages
	// over silently: an earlier version ran them.
	return g.rule.check(ctx, t.TurnID, t.Context, watermark, seq, watermark > 0, nil)
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
