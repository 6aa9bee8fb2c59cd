package approver

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/schemas"
)

// PendingTracker keeps a gauge of pending approvals by watching the
// approvals bucket. It reflects every writer (all executors and approvers),
// not just this process, because it reads the bucket itself.
type PendingTracker struct {
	kv      jetstream.KeyValue
	log     *slog.Logger
	gauge   prometheus.Gauge
	pending map[string]struct{}
}

// NewPendingTracker registers tollgate_approvals_pending with reg (if not nil).
func NewPendingTracker(kv jetstream.KeyValue, log *slog.Logger, reg prometheus.Registerer) (*PendingTracker, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tollgate_approvals_pending", Help: "Approval records currently in status pending.",
	})
	if reg != nil {
		if err := reg.Register(g); err != nil {
			return nil, err
		}
	}
	return &PendingTracker{kv: kv, log: log, gauge: g, pending: map[string]struct{}{}}, nil
}

// Run watches until ctx is cancelled. Records that do not decode are counted
// as not pending and logged.
func (p *PendingTracker) Run(ctx context.Context) error {
	w, err := p.kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil { // initial values delivered
				continue
			}
			p.apply(e)
		}
	}
}

func (p *PendingTracker) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	isPending := false
	if e.Operation() == jetstream.KeyValuePut {
		rec, err := schemas.Decode[schemas.ApprovalRecord](e.Value())
		if err != nil {
			p.log.Warn("pending tracker: undecodable approval record", "key", key, "err", err)
		} else {
			isPending = rec.Status == schemas.ApprovalPending
		}
	}
	if isPending {
		p.pending[key] = struct{}{}
	} else {
		delete(p.pending, key)
	}
	p.gauge.Set(float64(len(p.pending)))
}
