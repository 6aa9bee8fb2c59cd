package chat

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// MaxRetryAfter caps one wait for a rate limit, in case a server asks for
// hours.
const MaxRetryAfter = 2 * time.Minute

// Queue serialises a chat platform's calls per channel and waits out rate
// limits: a call answered "rate limited" is made again after its
// Retry-After (at least 100 ms, at most MaxRetryAfter), in order, until it
// succeeds, fails otherwise, or ctx ends. Other channels are not held up.
// The zero value is not usable; use NewQueue.
type Queue struct {
	log *slog.Logger
	// limited reports whether err is a rate limit, and its Retry-After.
	limited func(err error) (time.Duration, bool)
	mu      sync.Mutex
	chs     map[string]*sync.Mutex
}

// NewQueue returns a queue that tells rate limits apart with limited.
func NewQueue(log *slog.Logger, limited func(err error) (time.Duration, bool)) *Queue {
	return &Queue{log: log, limited: limited, chs: map[string]*sync.Mutex{}}
}

// Do runs call in channel's turn ("" runs it at once, outside any
// channel's order), again after each rate limit; it returns call's last
// error, or ctx's.
func (q *Queue) Do(ctx context.Context, channel string, call func() error) error {
	if channel != "" {
		q.mu.Lock()
		m, ok := q.chs[channel]
		if !ok {
			m = &sync.Mutex{}
			q.chs[channel] = m
		}
		q.mu.Unlock()
		m.Lock()
		defer m.Unlock()
	}
	for {
		err := call()
		after, limited := q.limited(err)
		if !limited {
			return err
		}
		wait := min(max(after, 100*time.Millisecond), MaxRetryAfter)
		q.log.Info("rate limited; waiting", "channel", channel, "retry_after", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
