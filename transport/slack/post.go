package slack

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/slack-go/slack"
)

// poster serialises calls per channel and waits out rate limits: a call
// answered 429 is retried after its Retry-After, in order, until it
// succeeds, fails otherwise, or ctx ends. Other channels are not held up.
type poster struct {
	api *slack.Client
	log *slog.Logger
	mu  sync.Mutex
	chs map[string]*sync.Mutex
}

func newPoster(api *slack.Client, log *slog.Logger) *poster {
	return &poster{api: api, log: log, chs: map[string]*sync.Mutex{}}
}

// maxRetryAfter caps one wait, in case a server asks for hours.
const maxRetryAfter = 2 * time.Minute

func (p *poster) do(ctx context.Context, channel string, call func() error) error {
	p.mu.Lock()
	m, ok := p.chs[channel]
	if !ok {
		m = &sync.Mutex{}
		p.chs[channel] = m
	}
	p.mu.Unlock()
	m.Lock()
	defer m.Unlock()
	for {
		err := call()
		var rl *slack.RateLimitedError
		if !errors.As(err, &rl) {
			return err
		}
		wait := min(max(rl.RetryAfter, 100*time.Millisecond), maxRetryAfter)
		p.log.Info("slack: rate limited; waiting", "channel", channel, "retry_after", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
