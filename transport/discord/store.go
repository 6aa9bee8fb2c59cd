package discord

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/transport/chat"
)

// The transport's own KV buckets (chat.Provision).
const (
	// BucketSeen holds replay records (ix.<interaction id>) for SeenTTL:
	// longer than the 5-minute signature window, so an interaction is
	// refused for as long as its signature could still verify. It also
	// holds the clicks (click.<decision>: the interaction token for a
	// follow-up), which are of no use after 15 minutes.
	BucketSeen = "tollgate_" + Name + "_seen"
	// BucketRecords holds what was posted (prompt.<approval>,
	// outcome.<turn>, reply.<turn>, rejected.<hash>). No TTL.
	BucketRecords = "tollgate_" + Name
	// SeenTTL is BucketSeen's max age.
	SeenTTL = chat.SeenTTL
)

// Provision creates the transport's buckets if they do not exist and binds
// to them. Under a least-privilege deployment the admin user creates them
// (the transport's user may only read and write them).
func Provision(ctx context.Context, js jetstream.JetStream, replicas int) (seen, records jetstream.KeyValue, err error) {
	return chat.Provision(ctx, js, Name, "Discord", replicas)
}

func clickKey(decisionID string) string { return "click." + decisionID }
