package sessionorder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// rule is the part of the session-order rule a Checker and a Gate share:
// the scan of a session's earlier inbound messages, the admission rule
// that settles a message that can never be a turn, and the order wait
// after which an unsettled one is passed over (counted in
// tollgate_session_order_skipped_total).
type rule struct {
	policy  *policy.Policy
	now     func() time.Time
	logger  *slog.Logger
	wait    time.Duration
	skipped prometheus.Counter
	inbound inbound
}

// newRule returns the rule, with DefaultWait for a wait of zero, its
// counter registered on reg (shared by every Checker and Gate on it).
func newRule(js jetstream.JetStream, pol *policy.Policy, now func() time.Time, logger *slog.Logger, reg prometheus.Registerer, wait time.Duration) (*rule, error) {
	if wait <= 0 {
		wait = DefaultWait
	}
	r := &rule{policy: pol, now: now, logger: logger, wait: wait, inbound: inbound{js: js},
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_session_order_skipped_total",
			Help: "Earlier inbound messages of a session that a later turn stopped waiting for after the order wait (package sessionorder).",
		})}
	if err := metrics.Register(reg, &r.skipped); err != nil {
		return nil, err
	}
	return r, nil
}

// verdict is what a caller of rule.check knows of the turn an earlier
// inbound message becomes.
type verdict int

const (
	undecided verdict = iota // nothing yet: the order wait decides
	settled                  // it can no longer run before the turn checked
	waits                    // it comes first, however long that takes
)

// check returns nil when every inbound message of the session of tc
// stored after watermark and before seq (the turn's own) is settled, an
// *OutOfOrder for the first that is not, or the error of a look-up. A
// message is settled when the admission rule refuses it (it never becomes
// a turn: ingest dead-letters it), when it becomes turn self (an earlier
// delivery of the same message, retried under another message id), when
// placed (nil: undecided) says so, or, undecided, once it was stored
// longer than the order wait ago; such a pass is counted and logged when
// count is set.
func (r *rule) check(ctx context.Context, self string, tc *schemas.TurnContext, watermark, seq uint64, count bool, placed func(turn string) (verdict, error)) error {
	stream, err := r.inbound.stream(ctx)
	if err != nil {
		return err
	}
	key, filter := inboundFilter(tc)
	for from := watermark + 1; from < seq; {
		m, err := stream.GetMsg(ctx, from, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("session order: next inbound message of %s after %d: %w", key, from-1, err)
		}
		if m.Sequence >= seq {
			return nil
		}
		ok, err := r.settled(tc, self, m, count, placed)
		if err != nil {
			return err
		}
		if !ok {
			return &OutOfOrder{Turn: self, Seq: seq, Earlier: m.Sequence}
		}
		from = m.Sequence + 1
	}
	return nil
}

// earliest reports whether no inbound message of the session of tc is
// stored before seq (the turn's own): the session's first message the
// stream keeps is at seq or later, or there is none. One lookup, from
// the stream's first sequence: the server finds a subject's first
// message by its index, without walking the messages between.
func (r *rule) earliest(ctx context.Context, tc *schemas.TurnContext, seq uint64) (bool, error) {
	stream, err := r.inbound.stream(ctx)
	if err != nil {
		return false, err
	}
	key, filter := inboundFilter(tc)
	m, err := stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("session order: first inbound message of %s: %w", key, err)
	}
	return m.Sequence >= seq, nil
}

// inboundFilter is the session key of tc and the subject its inbound
// messages are stored on: the literal subject of its transport (a message
// another transport stores under the key can never be one of the
// session's turns), or, for a legacy key shared by transports, their
// wildcard.
func inboundFilter(tc *schemas.TurnContext) (key, filter string) {
	key = schemas.SessionKeyOf(tc)
	if tc.SessionKey != "" {
		return key, topology.InboundSessionSubject(tc.Transport, key)
	}
	return key, topology.InboundSessionFilter(key)
}

// settled is check's verdict on one earlier inbound message m.
func (r *rule) settled(tc *schemas.TurnContext, self string, m *jetstream.RawStreamMsg, count bool, placed func(string) (verdict, error)) (bool, error) {
	// Admit is deterministic for a given policy.
	t, err := r.policy.Admit(m.Subject, m.Data, schemas.Provenance{StreamSeq: m.Sequence, ReceivedAt: m.Time})
	if err != nil || t.TurnID == self {
		return true, nil
	}
	if placed != nil {
		v, err := placed(t.TurnID)
		switch {
		case err != nil:
			return false, err
		case v != undecided:
			return v == settled, nil
		}
	}
	age := r.now().Sub(m.Time)
	if age <= r.wait {
		return false, nil
	}
	if count {
		r.skipped.Inc()
		r.logger.Warn("session order: an earlier inbound message was not settled within the order wait; letting later turns pass it",
			"session", tc.SessionID, "inbound_seq", m.Sequence, "turn", t.TurnID, "waited", age)
	}
	return true, nil
}

// inbound is the TOLLGATE_INBOUND handle, looked up once.
type inbound struct {
	js jetstream.JetStream
	mu sync.Mutex
	s  jetstream.Stream
}

func (in *inbound) stream(ctx context.Context) (jetstream.Stream, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.s != nil {
		return in.s, nil
	}
	s, err := in.js.Stream(ctx, topology.StreamInbound)
	if err != nil {
		return nil, fmt.Errorf("session order: stream %s: %w", topology.StreamInbound, err)
	}
	in.s = s
	return s, nil
}
