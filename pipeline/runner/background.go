package runner

import (
	"context"
	"log/slog"
	"time"
)

// Background runs fn in a goroutine until ctx is cancelled, starting it
// again (after restartDelay) whenever it returns early, e.g. because a KV
// watch ended across a broker restart. The returned wait blocks until the
// goroutine has finished, so that a stage's Run can return only once
// nothing of it is left running.
func Background(ctx context.Context, log *slog.Logger, what string, fn func(context.Context) error) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			err := fn(ctx)
			if ctx.Err() != nil {
				return
			}
			log.Warn(what+" ended; restarting it", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(restartDelay):
			}
		}
	}()
	return func() { <-done }
}

const restartDelay = time.Second
