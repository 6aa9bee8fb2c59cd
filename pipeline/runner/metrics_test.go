package runner_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/pipeline/runner"
)

func TestNewMetricsSharesOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := runner.NewMetrics(reg)
	b := runner.NewMetrics(reg) // a second stage wired on its own in the same process
	if a.Received != b.Received || a.DeadLettered != b.DeadLettered || a.Duration != b.Duration {
		t.Fatal("the second Metrics counts into collectors of its own, which the registry never exposes")
	}
	a.Acked.WithLabelValues("ingest").Inc()
	b.Acked.WithLabelValues("executor").Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, mf := range mfs {
		if mf.GetName() == "tollgate_messages_acked_total" {
			series = len(mf.GetMetric())
		}
	}
	if series != 2 {
		t.Fatalf("the registry exposes %d acked series, want both stages' 2", series)
	}
}

func TestNewMetricsPanicsOnAConflictingMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "tollgate_messages_acked_total", Help: "something else"}))
	defer func() {
		if recover() == nil {
			t.Fatal("NewMetrics accepted a registry holding another metric of one of its names")
		}
	}()
	runner.NewMetrics(reg)
}
