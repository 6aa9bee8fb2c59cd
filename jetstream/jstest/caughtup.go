package jstest

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// CaughtUp reports whether the durable consumer on stream has handled
// every message stored so far that its filter matches: its ack floor has
// reached the last such message and nothing is pending or unacknowledged.
// The string says what it saw, for EventuallyState. Pending counts alone
// are not enough: the server acknowledges a publish before it tells the
// stream's consumers, so right after a publish a consumer's info can still
// say nothing is pending.
func CaughtUp(ctx context.Context, js jetstream.JetStream, stream, consumer string) (bool, string) {
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return false, err.Error()
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	last, err := LastMatching(ctx, js, stream, filters)
	if err != nil {
		return false, err.Error()
	}
	return info.AckFloor.Stream >= last && info.NumPending == 0 && info.NumAckPending == 0,
		fmt.Sprintf("ack floor %d of last matching %d, pending %d, ack pending %d", info.AckFloor.Stream, last, info.NumPending, info.NumAckPending)
}

// LastMatching is the sequence of the last message stored in stream on
// any of filters (all of it when filters is empty; 0: none).
func LastMatching(ctx context.Context, js jetstream.JetStream, stream string, filters []string) (uint64, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	if len(filters) == 0 {
		info, err := st.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("stream %s: %w", stream, err)
		}
		return info.State.LastSeq, nil
	}
	var last uint64
	for _, f := range filters {
		m, err := st.GetLastMsgForSubject(ctx, f)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return 0, fmt.Errorf("last message on %s: %w", f, err)
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}
