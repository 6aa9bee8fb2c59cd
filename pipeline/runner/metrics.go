package runner

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Metrics are the per-stage message counters and timings, shared by the
// runners of one process; the stage is a label. They also know which
// runners run, for readiness (Consuming).
type Metrics struct {
	Received     *prometheus.CounterVec
	Acked        *prometheus.CounterVec
	Retried      *prometheus.CounterVec
	DeadLettered *prometheus.CounterVec
	Panics       *prometheus.CounterVec
	// ConsumeRestarts counts consume loops the watchdog restarted.
	ConsumeRestarts *prometheus.CounterVec
	Duration        *prometheus.HistogramVec

	mu      sync.Mutex
	running map[*Runner]struct{} // runners whose Run is running
}

// Consuming is nil when some runner of component stage (Config.Component,
// the value of the "stage" label) that counts into m is consuming (Runner.Ready); otherwise it is the reason none is (every
// running one's, joined), or that none runs.
func (m *Metrics) Consuming(stage string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for r := range m.running {
		if r.cfg.Component != stage {
			continue
		}
		err := r.Ready()
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return fmt.Errorf("stage %s is not running", stage)
	}
	return errors.Join(errs...)
}

func (m *Metrics) track(r *Runner) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running == nil {
		m.running = map[*Runner]struct{}{}
	}
	m.running[r] = struct{}{}
}

func (m *Metrics) untrack(r *Runner) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.running, r)
}

// NewMetrics registers the runner metrics with reg (nil: not registered)
// through metrics.Register: where reg already holds them (another stage's
// or an earlier call's), the returned Metrics count into those. It panics,
// like prometheus.MustRegister, if reg refuses one (another metric of the
// same name): a wiring mistake, not a condition to handle.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_messages_received_total", Help: "Messages delivered to a stage, redeliveries included.",
		}, []string{"stage"}),
		Acked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_messages_acked_total", Help: "Messages a stage processed and acknowledged.",
		}, []string{"stage"}),
		Retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_messages_retried_total", Help: "Messages a stage NAKed with a delay for a later retry.",
		}, []string{"stage"}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_messages_dead_lettered_total", Help: "Messages a stage moved to the dead-letter stream, by reason code.",
		}, []string{"stage", "code"}),
		Panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_handler_panics_total", Help: "Handler panics recovered by a stage.",
		}, []string{"stage"}),
		ConsumeRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_consume_restarts_total", Help: "Consume loops a stage's watchdog restarted because deliveries stalled while its consumer had work.",
		}, []string{"stage"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tollgate_message_processing_seconds",
			Help:    "Time a stage spent on one delivery, from receipt to its ack decision.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
		}, []string{"stage"}),
	}
	for _, c := range []**prometheus.CounterVec{&m.Received, &m.Acked, &m.Retried, &m.DeadLettered, &m.Panics, &m.ConsumeRestarts} {
		must(metrics.Register(reg, c))
	}
	must(metrics.Register(reg, &m.Duration))
	legacyKeys := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "tollgate_legacy_session_keys_total",
		Help: "Session keys this process resolved by the compatibility path: turns sealed before sessions were scoped by transport (schemas.SessionKeyOf).",
	}, func() float64 { return float64(schemas.LegacySessionKeyUses()) })
	must(metrics.Register(reg, &legacyKeys))
	return m
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
