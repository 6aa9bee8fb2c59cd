package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/metrics"
)

func TestSumAddsTheSeriesWhoseLabelsMatch(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"stage", "kind"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	reg.MustRegister(c, g)
	c.WithLabelValues("executor", "a").Add(2)
	c.WithLabelValues("executor", "b").Add(3)
	c.WithLabelValues("approver", "a").Add(5)
	g.Set(7)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"every series without labels", "c_total", nil, 10},
		{"the series with one label", "c_total", map[string]string{"stage": "executor"}, 5},
		{"the series with both labels", "c_total", map[string]string{"stage": "executor", "kind": "b"}, 3},
		{"no series with a label value none has", "c_total", map[string]string{"stage": "nobody"}, 0},
		{"a gauge", "g", nil, 7},
		{"a name not gathered", "missing_total", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := metrics.Sum(mfs, tc.metric, tc.labels); got != tc.want {
				t.Errorf("Sum(%s, %v) = %v, want %v", tc.metric, tc.labels, got, tc.want)
			}
		})
	}
}
