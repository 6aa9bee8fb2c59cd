package runner

import (
	"context"
	"errors"
)

// RunAll runs rs, the runners of one stage (one per durable consumer), until
// parent is cancelled, and returns once every one of them has returned. The
// first runner to fail stops the others and its error is returned; stopped by
// parent (even while starting), RunAll returns nil.
func RunAll(parent context.Context, rs ...*Runner) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	errc := make(chan error, len(rs))
	for _, r := range rs {
		go func() { errc <- r.Run(ctx) }()
	}
	var first error
	for range rs {
		err := <-errc
		if err != nil && parent.Err() != nil && errors.Is(err, context.Canceled) {
			err = nil
		}
		if err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}
