// Package bus publishes Tollgate records to JetStream streams with message
// ids, so that a retried publish inside the stream's duplicate window is
// stored once.
//
// Every message it publishes carries the trace context of the span in the
// publish's context (W3C traceparent and tracestate headers, package
// tracing), so that the stage that handles it continues the trace. A
// context without a span adds no header.
package bus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
)

// Publish encodes r and publishes it on subject with Nats-Msg-Id msgID,
// waiting for the stream's acknowledgement. An empty msgID publishes without
// dedupe. It returns only once the message is stored (or fails).
func Publish(ctx context.Context, js jetstream.JetStream, subject, msgID string, r schemas.Record) error {
	data, err := schemas.Encode(r)
	if err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return PublishRaw(ctx, js, subject, msgID, data, nil)
}

// PublishRaw publishes data with optional headers and message id, adding
// the trace context of ctx's span to a copy of hdr (see the package doc). A
// message that can never be stored because of its size (over the
// connection's max payload, the stream's message size limit, or
// JetStream's 64 KiB limit on a header block) fails with
// CodePayloadTooLarge, so that schemas.Permanent tells it from a failure
// that a retry may cure.
func PublishRaw(ctx context.Context, js jetstream.JetStream, subject, msgID string, data []byte, hdr nats.Header) error {
	_, err := PublishAck(ctx, js, subject, msgID, data, hdr)
	return err
}

// PublishAck is PublishRaw returning the stream's acknowledgement: the
// stream and sequence that hold the message, and for a message id already
// stored within the duplicate window, Duplicate and the sequence of the
// copy stored first.
func PublishAck(ctx context.Context, js jetstream.JetStream, subject, msgID string, data []byte, hdr nats.Header) (*jetstream.PubAck, error) {
	m := &nats.Msg{Subject: subject, Data: data, Header: tracing.Inject(ctx, hdr)}
	if msgID != "" {
		// In a copy of the headers: hdr is the caller's, and
		// jetstream.WithMsgID would set the header in it.
		h := make(nats.Header, len(m.Header)+1)
		maps.Copy(h, m.Header)
		h.Set(jetstream.MsgIDHeader, msgID)
		m.Header = h
	}
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		if TooLarge(err) {
			return nil, schemas.Errorf(schemas.CodePayloadTooLarge, "publish %s (msg id %q): %w", subject, msgID, err)
		}
		return nil, fmt.Errorf("publish %s (msg id %q): %w", subject, msgID, err)
	}
	return ack, nil
}

// DefaultAttemptTimeout is how long one of Store's attempts waits for the
// stream's acknowledgement.
const DefaultAttemptTimeout = 5 * time.Second

// The wait between two of Store's attempts starts at storeRetryWait and
// doubles up to storeRetryMaxWait.
const (
	storeRetryWait    = 100 * time.Millisecond
	storeRetryMaxWait = 2 * time.Second
)

// StoreOption sets an optional setting of Store.
type StoreOption func(*storeOptions)

type storeOptions struct{ attempt time.Duration }

// WithAttemptTimeout sets how long each attempt waits for the stream's
// acknowledgement (DefaultAttemptTimeout).
func WithAttemptTimeout(d time.Duration) StoreOption {
	return func(o *storeOptions) {
		if d > 0 {
			o.attempt = d
		}
	}
}

// Store is PublishAck for a message that a surface must get stored (an
// inbound chat message, a decision), however long the stream takes to
// answer, up to the end of ctx: each attempt waits at most the attempt
// timeout, and one that fails in a way that may pass by itself
// (Retryable) is made again under the same message id, 100 ms later,
// doubling to 2 s, until one is stored or refused for good, or ctx ends.
// On a cluster a publish that reaches a stream leader as it loses its
// leadership, or a replica cut off from its peers, can go unanswered;
// waiting for that answer until the caller's deadline would fail a
// message that the next leader would have stored at once. The message id
// makes the attempts one message (the stream's duplicate window keeps
// one copy), so Store refuses an empty one. A refusal for good (a
// compare-and-set's, a size's: CodePayloadTooLarge) is returned at once;
// when ctx ends first, the error wraps ctx's and the last attempt's.
func Store(ctx context.Context, js jetstream.JetStream, subject, msgID string, data []byte, hdr nats.Header, opts ...StoreOption) (*jetstream.PubAck, error) {
	if msgID == "" {
		return nil, fmt.Errorf("store on %s: no message id, so an attempt made again could be stored twice", subject)
	}
	o := storeOptions{attempt: DefaultAttemptTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	wait := storeRetryWait
	for {
		actx, cancel := context.WithTimeout(ctx, o.attempt)
		ack, err := PublishAck(actx, js, subject, msgID, data, hdr)
		cancel()
		switch {
		case err == nil:
			return ack, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case !Retryable(err):
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, storeRetryMaxWait)
	}
}

// Retryable reports whether a publish's error may pass by itself, so that
// the same message, under the same message id, may be sent again: its
// outcome is unknown (UnknownOutcome: an attempt's timeout, no stream
// answering, as during an election), JetStream is temporarily unavailable
// (503), or an earlier attempt with the same message id is still being
// stored (10158).
func Retryable(err error) bool {
	if UnknownOutcome(err) {
		return true
	}
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.Code == 503 || api.ErrorCode == jsErrCodeDuplicateInProcess)
}

// jsErrCodeDuplicateInProcess is nats-server's "duplicate message id is in
// process" (JSStreamDuplicateMessageConflict, 409): an earlier publish of
// the same message id is not yet stored or refused.
const jsErrCodeDuplicateInProcess jetstream.ErrorCode = 10158

// jsErrCodeHeaderExceedsMaximum is nats-server's "header size exceeds
// maximum allowed of 64k" (JSStreamHeaderExceedsMaximumErr), which nats.go
// does not name.
const jsErrCodeHeaderExceedsMaximum jetstream.ErrorCode = 10097

// TooLarge reports whether err is a publish refused for the message's
// size (over the connection's max payload, the stream's message size
// limit, or JetStream's 64 KiB limit on a header block): a refusal no
// retry cures. Writers that publish without PublishRaw classify their
// errors with it.
func TooLarge(err error) bool {
	if err == nil {
		return false
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		return api.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum || api.ErrorCode == jsErrCodeHeaderExceedsMaximum
	}
	return errors.Is(err, nats.ErrMaxPayload)
}

// Stored reports whether stream s holds a message on subject (its last
// one, looked up by subject): the check before publishing a fact at most
// once past the duplicate window. It fails only when the lookup does.
func Stored(ctx context.Context, s jetstream.Stream, subject string) (bool, error) {
	_, err := s.GetLastMsgForSubject(ctx, subject)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("look up %s: %w", subject, err)
	}
}

// Scan hands every message of stream matching filter to fn, in order, up
// to the stream's last message when it started, through an ordered
// consumer: for tools that read a stream back (checks after a run). It
// stops at fn's first error.
func Scan(ctx context.Context, js jetstream.JetStream, stream, filter string, fn func(jetstream.Msg) error) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return err
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return err
	}
	for left := info.NumPending; left > 0; {
		batch, err := cons.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if err := fn(m); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("scan %s %s: %d messages left but none delivered", stream, filter, left)
		}
		left -= uint64(n)
	}
	return nil
}

// WrongLast reports a publish refused by its compare-and-set: the
// subject's (or the stream's) last sequence was not the one the publish
// expected (JetStream 10071, or 10164 for a constant's). The stream's
// state has moved on: read it again and decide again.
func WrongLast(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// UnknownOutcome reports a publish whose outcome is unknown: no
// acknowledgement came (a timeout, no stream response, no responders), so
// the message may or may not be stored. Send it again with the same
// message id, and the stream's duplicate window recognises it.
func UnknownOutcome(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders)
}
