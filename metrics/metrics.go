// Package metrics registers the pipeline's Prometheus collectors, one way
// for every stage.
package metrics

import (
	"errors"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
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
