package discord

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// The transport's own KV buckets.
const (
	// BucketSeen holds replay records (ix.<interaction id>) for SeenTTL:
	// longer than the 5-minute signature window, so an interaction is
	// refused for as long as its signature could still verify. It also
	// holds the clicks (click.<decision>: the interaction token for a
	// follow-up), which are of no use after 15 minutes.
	BucketSeen = "tollgate_discord_seen"
	// BucketRecords holds what was posted (prompt.<approval>,
	// outcome.<turn>, reply.<turn>, rejected.<hash>). No TTL.
	BucketRecords = "tollgate_discord"
	// SeenTTL is BucketSeen's max age.
	SeenTTL = time.Hour
)

// Provision creates the transport's buckets if they do not exist and binds
// to them. Under a least-privilege deployment the admin user creates them
// (the transport's user may only read and write them).
func Provision(ctx context.Context, js jetstream.JetStream, replicas int) (seen, records jetstream.KeyValue, err error) {
	replicas = max(replicas, 1)
	if seen, err = chat.OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketSeen, Description: "Tollgate Discord transport: interaction ids seen (replay window), clicks",
		History: 1, TTL: SeenTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	}); err != nil {
		return nil, nil, fmt.Errorf("discord: %w", err)
	}
	if records, err = chat.OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketRecords, Description: "Tollgate Discord transport: posted prompts, outcomes and replies",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas, MaxValueSize: 64 << 10,
	}); err != nil {
		return nil, nil, fmt.Errorf("discord: %w", err)
	}
	return seen, records, nil
}

// markSeen creates key in the seen bucket; false when it was seen before.
func (t *Transport) markSeen(ctx context.Context, key string) (bool, error) {
	return chat.MarkSeen(ctx, t.seen, key)
}

// recordVersion is the schema version of the transport's KV records.
const recordVersion = 1

// post is a posted message: a prompt (prompt.<approval>), another post
// (outcome.<turn>, reply.<turn>, rejected.<hash>), or a click whose
// interaction may get a follow-up (click.<decision>: App and Token).
type post struct {
	V         int    `msgpack:"v"`
	Channel   string `msgpack:"channel"`
	MessageID string `msgpack:"message_id"`
	// Prompts only.
	ApprovalID string              `msgpack:"approval_id,omitempty"`
	Tool       string              `msgpack:"tool,omitempty"`
	Digest     string              `msgpack:"digest,omitempty"`
	Kind       schemas.ChannelKind `msgpack:"kind,omitempty"` // of Channel
	Closed     bool                `msgpack:"closed,omitempty"`
	// Clicks only: the interaction's application id and token (valid for
	// 15 minutes after At).
	App   string    `msgpack:"app,omitempty"`
	Token string    `msgpack:"token,omitempty"`
	At    time.Time `msgpack:"at"`
}

// RecordVersion is the version the record was written with.
func (p *post) RecordVersion() int { return p.V }

func promptKey(approvalID string) string { return "prompt." + approvalID }

// bucket is where a record lives: clicks in the seen bucket (they expire
// with it), everything else in the records bucket.
func (t *Transport) bucket(key string) jetstream.KeyValue {
	if strings.HasPrefix(key, "click.") {
		return t.seen
	}
	return t.records
}

// getPost reads a record; nil without error when there is none.
func (t *Transport) getPost(ctx context.Context, key string) (*post, uint64, error) {
	return chat.Get[post](ctx, t.bucket(key), key, recordVersion)
}

// putPost creates (rev 0) or compare-and-sets a record; chat.ErrWritten
// when another write came first.
func (t *Transport) putPost(ctx context.Context, key string, p *post, rev uint64) error {
	p.V = recordVersion
	return chat.Put(ctx, t.bucket(key), key, p, rev)
}

// approval reads an approval record; nil without error when absent.
func (t *Transport) approval(ctx context.Context, id string) (*schemas.ApprovalRecord, error) {
	return chat.Approval(ctx, t.approvals, id)
}
