package runner_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// A runner is ready only while it consumes: not before Run, not while it
// drains after its context is cancelled (a handler still holds a message,
// so Run has not returned), and not after Run returns. Metrics.Consuming
// says the same for the stage.
func TestARunnerIsReadyOnlyWhileConsuming(t *testing.T) {
	h := newHarness(t, "ready-test")
	if err := h.cfg.Metrics.Consuming(h.stage); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("stage before Run: %v, want not running", err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	r, stop := h.start(func(context.Context, jetstream.Msg) error {
		close(entered)
		<-release
		return nil
	})
	jstest.Eventually(t, wait, "runner ready", func() bool { return r.Ready() == nil && h.cfg.Metrics.Consuming(h.stage) == nil })

	h.publish(subject("s-1"), []byte("x"), nil)
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	jstest.Eventually(t, wait, "runner draining", func() bool {
		err := r.Ready()
		return err != nil && strings.Contains(err.Error(), "draining")
	})
	if err := h.cfg.Metrics.Consuming(h.stage); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("stage while draining: %v, want draining", err)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) while its handler still held a message", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("runner after Run returned: %v, want not running", err)
	}
	if err := h.cfg.Metrics.Consuming(h.stage); err == nil {
		t.Fatal("stage ready after its runner returned")
	}
}
