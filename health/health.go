// Package health is the readiness of one Tollgate process: a set of named
// checks that its composition root fills (tollgate.Pipeline.Checks, a
// gateway's own), served as /readyz and exported as the gauge
// tollgate_ready{stage} (internal/scaffold serves both next to /metrics,
// with /healthz).
//
// A process is ready when every check passes. Until checks are added
// (the process is still starting: waiting for the broker, checking or
// provisioning the topology), it is not ready.
package health

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Check is one readiness condition.
type Check struct {
	// Name names it in /readyz, e.g. "nats" or "executor/consumer".
	Name string
	// Stage is the stage (or component, e.g. "gateway") whose
	// tollgate_ready gauge it counts toward; empty: every one's.
	Stage string
	// Check is nil when the condition holds, else why not. It must be
	// cheap and return promptly once ctx ends.
	Check func(ctx context.Context) error
}

// Result is one check's outcome in a Report.
type Result struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Report is the body of /readyz: Ready when every check passed, and each
// check's result.
type Report struct {
	Ready  bool     `json:"ready"`
	Checks []Result `json:"checks"`
}

// Timeout bounds one evaluation of all checks (a /readyz request, a
// scrape of the gauge).
const Timeout = 2 * time.Second

// Registry holds a process's checks. Its methods are safe for concurrent
// use.
type Registry struct {
	stages []string
	gauge  *prometheus.Desc

	mu     sync.Mutex
	checks []Check
}

// New returns an empty registry (not ready) for a process that runs
// stages (or components), and registers the gauge tollgate_ready{stage}
// with reg (if not nil): 1 for a stage whose checks (its own and those of
// no stage) all pass, else 0, evaluated at each scrape.
func New(reg prometheus.Registerer, stages ...string) (*Registry, error) {
	r := &Registry{stages: slices.Clone(stages), gauge: prometheus.NewDesc("tollgate_ready",
		"1 when the stage in this process is ready (see /readyz): NATS connected, topology present, its consumer bound, its watches running, not draining; else 0.",
		[]string{"stage"}, nil)}
	if reg != nil {
		if err := reg.Register(r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Add adds checks; the process is ready once it has checks and they pass.
func (r *Registry) Add(checks ...Check) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks = append(r.checks, checks...)
}

// Report runs every check, in the order added. With no checks yet it
// reports not ready, with one failed check "started".
func (r *Registry) Report(ctx context.Context) Report {
	return report(ctx, r.snapshot())
}

func (r *Registry) snapshot() []Check {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.checks)
}

func report(ctx context.Context, checks []Check) Report {
	if len(checks) == 0 {
		return Report{Checks: []Result{{Name: "started", Error: "still starting"}}}
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	rep := Report{Ready: true}
	for _, c := range checks {
		res := Result{Name: c.Name, OK: true}
		if err := c.Check(ctx); err != nil {
			res.OK, res.Error, rep.Ready = false, err.Error(), false
		}
		rep.Checks = append(rep.Checks, res)
	}
	return rep
}

// ServeHTTP answers /readyz: 200 with the Report when ready, 503 with it
// when not, as JSON.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rep := r.Report(req.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !rep.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(rep)
}

// Alive answers /healthz: 200 while the process serves HTTP at all.
func Alive(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// Describe is prometheus.Collector's.
func (r *Registry) Describe(ch chan<- *prometheus.Desc) { ch <- r.gauge }

// Collect is prometheus.Collector's: tollgate_ready{stage} for each stage
// New was given.
func (r *Registry) Collect(ch chan<- prometheus.Metric) {
	checks := r.snapshot()
	rep := report(context.Background(), checks)
	for _, s := range r.stages {
		ready := len(checks) > 0
		for i, c := range checks {
			if (c.Stage == "" || c.Stage == s) && !rep.Checks[i].OK {
				ready = false
			}
		}
		v := 0.0
		if ready {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(r.gauge, prometheus.GaugeValue, v, s)
	}
}

// NATS is the check "nats": nc is connected (not disconnected,
// reconnecting or closed).
func NATS(nc *nats.Conn) Check {
	return Check{Name: "nats", Check: func(context.Context) error {
		if st := nc.Status(); st != nats.CONNECTED {
			return fmt.Errorf("nats: %s", st)
		}
		return nil
	}}
}
