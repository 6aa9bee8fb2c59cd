package runner_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
)

func TestBackgroundRestartsWorkThatEndsEarlyAndIsWaitedFor(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var starts atomic.Int32
	var running atomic.Bool
	wait := runner.Background(ctx, pt.Logger(), "test work", func(ctx context.Context) error {
		if starts.Add(1) <= 2 {
			return errors.New("watch ended") // e.g. across a broker restart
		}
		running.Store(true)
		defer running.Store(false)
		<-ctx.Done()
		return nil
	})
	jstest.Eventually(t, jstest.Wait, "the work started a third time and keeps running", func() bool {
		return running.Load()
	})
	cancel()
	wait()
	if running.Load() {
		t.Fatal("wait returned while the work was still running")
	}
	if n := starts.Load(); n != 3 {
		t.Fatalf("started %d times, want 3", n)
	}
}
