package topology

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RetryAttempts is how often Retry calls its function at most.
const RetryAttempts = 5

// retryWait is Retry's first wait (a variable for tests).
var retryWait = 250 * time.Millisecond

// Retry calls fn, an idempotent set-up request (creating or updating
// streams, buckets or a durable consumer), until it succeeds, fails with an
// error that another attempt would not change, or has failed RetryAttempts
// times, waiting 250 ms, then twice as long each time, in between.
//
// On a cluster such requests are transient in ways a single server never
// shows: while the nodes elect a meta leader JetStream answers "temporarily
// unavailable" (10008), and when several processes start together and
// create the same stream or durable at once, nats-server can leave all but
// one of the requests unanswered (a timeout; nats-server issues #3677 and
// #8350, github.com/nats-io/nats-server/issues/3677 and
// github.com/nats-io/nats-server/issues/8350) or refuse one as "already in
// use" (10058). The next attempt finds the stream or consumer there and
// converges on it. Note that a request
// refused by NATS permissions also shows as a timeout: it is tried again
// too, and fails after about half a minute.
func Retry(ctx context.Context, fn func() error) error {
	wait := retryWait
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || attempt == RetryAttempts || ctx.Err() != nil || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// transient reports whether a set-up request's error may go away by itself.
func transient(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode {
		case 10008, // JetStream system temporarily unavailable (no meta leader yet)
			jetstream.JSErrCodeStreamNameInUse: // created concurrently by another process
			return true
		}
	}
	return false
}
