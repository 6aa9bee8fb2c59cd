package sessionorder

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/metrics"
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
	cfg     GateConfig
	skipped prometheus.Counter
	inbound inbound
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
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultWait
	}
	g := &Gate{cfg: cfg, skipped: newSkipped(), inbound: inbound{js: cfg.JS}}
	if err := metrics.Register(cfg.Registerer, &g.skipped); err != nil {
		return nil, err
	}
	return g, nil
}

// Check returns nil when t may join its session's order after an entry
// whose arrival watermark is watermark, an *OutOfOrder when an earlier
// inbound message of the session must join first, or another error when
// the lookups fail.
func (g *Gate) Check(ctx context.Context, t *schemas.AcceptedTurn, watermark uint64) error {
	if t.Origin != "" || t.Context == nil {
		return nil
	}
	seq := t.Context.Provenance.StreamSeq
	if seq == 0 || watermark+1 >= seq {
		return nil
	}
	stream, err := g.inbound.stream(ctx)
	if err != nil {
		return err
	}
	return earlier(ctx, stream, t.TurnID, t.Context, watermark, seq, func(m *jetstream.RawStreamMsg) (bool, error) {
		e, err := g.cfg.Policy.Admit(m.Subject, m.Data, schemas.Provenance{StreamSeq: m.Sequence, ReceivedAt: m.Time})
		switch {
		case err != nil:
			return true, nil // never a turn: ingest dead-letters it
		case e.TurnID == t.TurnID:
			return true, nil // an earlier delivery of the same message: this turn
		}
		age := g.cfg.Now().Sub(m.Time)
		if age <= g.cfg.Wait {
			return false, nil
		}
		if watermark > 0 {
			g.skipped.Inc()
			g.cfg.Logger.Warn("session order: an earlier inbound message never joined its session's order; letting later turns pass it",
				"session", t.Context.SessionID, "inbound_seq", m.Sequence, "turn", e.TurnID, "waited", age)
		}
		return true, nil
	})
}
