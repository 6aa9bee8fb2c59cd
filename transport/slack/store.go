package slack

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/transport/chat"
)

// The transport's own KV buckets (chat.Provision).
const (
	// BucketSeen holds replay and retry records (sig.<hash>, event.<hash>,
	// action.<hash>, view.<hash>) for SeenTTL: longer than Slack's
	// 5-minute replay window, so a request or event id is refused or
	// skipped for as long as a signature on it could still verify.
	BucketSeen = "tollgate_" + Name + "_seen"
	// BucketRecords holds what was posted (prompt.<approval>,
	// outcome.<turn>, reply.<turn>, rejected.<hash>) and the threads
	// Tollgate serves (thread.<hash>). No TTL.
	BucketRecords = "tollgate_" + Name
	// SeenTTL is BucketSeen's max age.
	SeenTTL = chat.SeenTTL
)

// Provision creates the transport's buckets if they do not exist and binds
// to them. Under a least-privilege deployment the admin user creates them
// (the transport's user may only read and write them): then a create
// refused for permissions is not an error as long as the bucket exists.
func Provision(ctx context.Context, js jetstream.JetStream, replicas int) (seen, records jetstream.KeyValue, err error) {
	return chat.Provision(ctx, js, Name, "Slack", replicas)
}

// hashKey is a KV-safe key for arbitrary parts.
func hashKey(prefix string, parts ...string) string { return chat.HashKey(prefix, parts...) }
