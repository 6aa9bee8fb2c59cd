package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/metrics"
)

const name = "tollgate_test_total"

func counter(help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func counterVec(labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: "h"}, labels)
}

// total is the sum of the series of the test metric in reg.
func total(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == name {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// register registers a fresh collector made by mk with reg and reports
// whether Register kept the fresh one, and its error.
func register[C interface {
	comparable
	prometheus.Collector
}](reg prometheus.Registerer, mk func() C) (kept bool, err error) {
	c := mk()
	orig := c
	err = metrics.Register(reg, &c)
	return c == orig, err
}

func TestRegister(t *testing.T) {
	t.Run("a nil registerer registers nothing and keeps the collector", func(t *testing.T) {
		c := counter("h")
		orig := c
		if err := metrics.Register(nil, &c); err != nil || c != orig {
			t.Fatalf("Register(nil) = %v, collector kept: %v", err, c == orig)
		}
	})

	t.Run("a new collector is registered and kept", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		c := counter("h")
		orig := c
		if err := metrics.Register(reg, &c); err != nil || c != orig {
			t.Fatalf("Register = %v, collector kept: %v", err, c == orig)
		}
		c.Add(3)
		if got := total(t, reg); got != 3 {
			t.Fatalf("registry counts %v, want 3", got)
		}
	})

	t.Run("an identical collector is replaced by the one registered first", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		first, second := counter("h"), counter("h")
		if err := metrics.Register(reg, &first); err != nil {
			t.Fatal(err)
		}
		if err := metrics.Register(reg, &second); err != nil {
			t.Fatalf("second identical registration: %v", err)
		}
		first.Inc()
		second.Inc()
		if got := total(t, reg); got != 2 {
			t.Fatalf("registry counts %v, want 2 (both stages count into one series)", got)
		}
	})

	t.Run("an identical vector is shared, with its labels", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		a, b := counterVec("stage"), counterVec("stage")
		if err := metrics.Register(reg, &a); err != nil {
			t.Fatal(err)
		}
		if err := metrics.Register(reg, &b); err != nil || a != b {
			t.Fatalf("Register = %v, shared %v", err, a == b)
		}
		a.WithLabelValues("approver").Inc()
		b.WithLabelValues("approver").Inc()
		if got := total(t, reg); got != 2 {
			t.Fatalf("registry counts %v, want 2", got)
		}
	})

	refused := []struct {
		name     string
		register func(reg prometheus.Registerer) (bool, error)
		want     string // in the error, besides the metric's name
	}{
		{"the same name with other help", func(reg prometheus.Registerer) (bool, error) {
			return register(reg, func() prometheus.Counter { return counter("other help") })
		}, "different help"},
		{"the same name with other labels", func(reg prometheus.Registerer) (bool, error) {
			return register(reg, func() *prometheus.CounterVec { return counterVec("stage") })
		}, "different label names"},
		{"the same metric as a vector where a counter is registered", func(reg prometheus.Registerer) (bool, error) {
			return register(reg, func() *prometheus.CounterVec { return counterVec() })
		}, "not a *prometheus.CounterVec"},
		{"the same metric as a gauge where a counter is registered", func(reg prometheus.Registerer) (bool, error) {
			return register(reg, func() prometheus.Gauge { return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "h"}) })
		}, "not a *prometheus.gauge"},
	}
	for _, tc := range refused {
		t.Run(tc.name+" is an error and keeps the collector", func(t *testing.T) {
			reg := prometheus.NewRegistry()
			first := counter("h")
			if err := metrics.Register(reg, &first); err != nil {
				t.Fatal(err)
			}
			kept, err := tc.register(reg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), name) {
				t.Fatalf("Register = %v, want an error naming %s with %q", err, name, tc.want)
			}
			if !kept {
				t.Fatal("a refused registration replaced the collector")
			}
		})
	}
}
