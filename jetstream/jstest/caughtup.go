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
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return false, err.Error()
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	var last uint64
	if len(filters) == 0 {
		si, err := st.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		last = si.State.LastSeq
	}
	for _, f := range filters {
		m, err := st.GetLastMsgForSubject(ctx, f)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return false, fmt.Sprintf("last message on %s: %v", f, err)
		}
		last = max(last, m.Sequence)
	}
	return info.AckFloor.Stream >= last && info.NumPending == 0 && info.NumAckPending == 0,
		fmt.Sprintf("ack floor %d of last matching %d, pending %d, ack pending %d", info.AckFloor.Stream, last, info.NumPending, info.NumAckPending)
}
