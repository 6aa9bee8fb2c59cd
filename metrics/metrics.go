// Package metrics registers the pipeline's Prometheus collectors, one way
// for every stage.
package metrics

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Register registers the collector *c with reg and leaves in *c the
// collector to count with:
//
//   - reg nil: nothing is registered and *c is unchanged (a stage built
//     without a registerer still counts, unexported);
//   - registered: *c is unchanged;
//   - reg already holds an identical collector (same name, help and labels:
//     prometheus.AlreadyRegisteredError) of the same Go type: *c becomes
//     that one, so two stages, or two instances of one, in one process share
//     one registry and count into the same series.
//
// Any other refusal, such as a collector of the same name with other labels
// or help, or an identical one of another Go type (a gauge where a counter
// is), is an error that names the metric, and *c is unchanged.
func Register[C prometheus.Collector](reg prometheus.Registerer, c *C) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(*c)
	var are prometheus.AlreadyRegisteredError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &are):
		return fmt.Errorf("register metrics: %w", err)
	}
	existing, ok := are.ExistingCollector.(C)
	if !ok {
		return fmt.Errorf("register metrics: %s is registered as a %T, not a %T: %w", describe(*c), are.ExistingCollector, *c, err)
	}
	*c = existing
	return nil
}

// describe names the metrics c collects.
func describe(c prometheus.Collector) string {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var descs []string
	for d := range ch {
		descs = append(descs, d.String())
	}
	return strings.Join(descs, ", ")
}

// Sum is the sum of the counter or gauge name over the series of mfs
// whose labels include every pair in labels (all series when labels is
// empty); 0 when there is none. Histograms and summaries are not summed.
func Sum(mfs []*dto.MetricFamily, name string, labels map[string]string) float64 {
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// hasLabels reports whether m carries every name=value pair of labels.
func hasLabels(m *dto.Metric, labels map[string]string) bool {
	for k, v := range labels {
		if !slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetName() == k && lp.GetValue() == v }) {
			return false
		}
	}
	return true
}
