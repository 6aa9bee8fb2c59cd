package slack

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// The transport's own KV buckets.
const (
	// BucketSeen holds replay and retry records (sig.<hash>, event.<id>,
	// action.<hash>) for SeenTTL: longer than Slack's 5-minute replay
	// window, so a request or event id is refused or skipped for as long
	// as a signature on it could still verify.
	BucketSeen = "tollgate_slack_seen"
	// BucketRecords holds what was posted (prompt.<approval>,
	// outcome.<turn>, reply.<turn>, rejected.<hash>) and the threads
	// Tollgate serves (thread.<hash>). No TTL.
	BucketRecords = "tollgate_slack"
	// SeenTTL is BucketSeen's max age.
	SeenTTL = time.Hour
)

// Provision creates the transport's buckets if they do not exist and binds
// to them. Under a least-privilege deployment the admin user creates them
// (the transport's user may only read and write them): then a create
// refused for permissions is not an error as long as the bucket exists.
func Provision(ctx context.Context, js jetstream.JetStream, replicas int) (seen, records jetstream.KeyValue, err error) {
	if replicas < 1 {
		replicas = 1
	}
	open := func(cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
		kv, err := chat.OpenBucket(ctx, js, cfg)
		if err != nil {
			return nil, fmt.Errorf("slack: %w", err)
		}
		return kv, nil
	}
	if seen, err = open(jetstream.KeyValueConfig{
		Bucket: BucketSeen, Description: "Tollgate Slack transport: request and event ids seen (replay window)",
		History: 1, TTL: SeenTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	}); err != nil {
		return nil, nil, err
	}
	if records, err = open(jetstream.KeyValueConfig{
		Bucket: BucketRecords, Description: "Tollgate Slack transport: posted prompts, outcomes and served threads",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas, MaxValueSize: 64 << 10,
	}); err != nil {
		return nil, nil, err
	}
	return seen, records, nil
}

// hashKey is a KV-safe key for arbitrary parts.
func hashKey(prefix string, parts ...string) string { return chat.HashKey(prefix, parts...) }

// markSeen creates key in the seen bucket; it reports false when the key
// already exists (seen before).
func (t *Transport) markSeen(ctx context.Context, key string) (bool, error) {
	return chat.MarkSeen(ctx, t.seen, key)
}

// unmarkSeen removes a seen record after the work it guarded failed before
// it was answered, so that Slack's retry is not skipped.
func (t *Transport) unmarkSeen(key string) { chat.Unmark(t.seen, key) }

// recordVersion is the schema version of the transport's KV records.
const recordVersion = 1

// post is a posted message: a prompt (prompt.<approval>) or another post
// (outcome.<turn>, reply.<turn>, rejected.<hash>, thread.<hash>).
type post struct {
	V       int    `msgpack:"v"`
	Channel string `msgpack:"channel"`
	TS      string `msgpack:"ts"`
	// Prompts only.
	ApprovalID string              `msgpack:"approval_id,omitempty"`
	Tool       string              `msgpack:"tool,omitempty"`
	Digest     string              `msgpack:"digest,omitempty"`
	Kind       schemas.ChannelKind `msgpack:"kind,omitempty"` // of Channel
	Closed     bool                `msgpack:"closed,omitempty"`
	At         time.Time           `msgpack:"at"`
}

// RecordVersion is the version the record was written with.
func (p *post) RecordVersion() int { return p.V }

func promptKey(approvalID string) string { return "prompt." + approvalID }

// getPost reads a record; nil without error when there is none. A record
// of another version is an error (never guessed).
func (t *Transport) getPost(ctx context.Context, key string) (*post, uint64, error) {
	return chat.Get[post](ctx, t.records, key, recordVersion)
}

// putPost creates (rev 0) or compare-and-sets a record; errWritten when
// another write came first.
func (t *Transport) putPost(ctx context.Context, key string, p *post, rev uint64) error {
	p.V = recordVersion
	return chat.Put(ctx, t.records, key, p, rev)
}

// errWritten: a create found the key, or a compare-and-set lost: another
// worker wrote the record first.
var errWritten = chat.ErrWritten

// approval reads an approval record; nil without error when absent.
func (t *Transport) approval(ctx context.Context, id string) (*schemas.ApprovalRecord, error) {
	return chat.Approval(ctx, t.approvals, id)
}
