package slack

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/transport/chat"
)

// poster serialises calls per channel and waits out rate limits: a call
// answered 429 is retried after its Retry-After, in order, until it
// succeeds, fails otherwise, or ctx ends (chat.Queue). Other channels are
// not held up.
type poster struct{ q *chat.Queue }

func newPoster(log *slog.Logger) *poster {
	return &poster{q: chat.NewQueue(log.With("transport", Name), func(err error) (time.Duration, bool) {
		var rl *slack.RateLimitedError
		if errors.As(err, &rl) {
			return rl.RetryAfter, true
		}
		return 0, false
	})}
}

func (p *poster) do(ctx context.Context, channel string, call func() error) error {
	return p.q.Do(ctx, channel, call)
}
