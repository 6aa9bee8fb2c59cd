// Package bus publishes Tollgate records to JetStream streams with message
// ids, so that a retried publish inside the stream's duplicate window is
// stored once.
package bus

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
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

// PublishRaw publishes data with optional headers and message id.
func PublishRaw(ctx context.Context, js jetstream.JetStream, subject, msgID string, data []byte, hdr nats.Header) error {
	m := &nats.Msg{Subject: subject, Data: data, Header: hdr}
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	if _, err := js.PublishMsg(ctx, m, opts...); err != nil {
		return fmt.Errorf("publish %s (msg id %q): %w", subject, msgID, err)
	}
	return nil
}
