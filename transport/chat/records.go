package chat

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
)

// SeenTTL is the max age of a transport's seen bucket: longer than the
// platforms' 5-minute replay window, so a request is refused or skipped
// for as long as a signature on it could still verify, and longer than
// the 15 minutes a Discord interaction token lives.
const SeenTTL = time.Hour

// BucketSeen is transport name's bucket of replay and retry records
// (sig.<hash>, event.<hash>, action.<hash>, view.<hash>, ix.<id>) and
// clicks (click.<decision>), kept for SeenTTL.
func BucketSeen(name string) string { return "tollgate_" + name + "_seen" }

// BucketRecords is transport name's bucket of what it posted
// (prompt.<approval>, outcome.<turn>, reply.<turn>, rejected.<hash>) and
// the threads it serves (thread.<hash>). No TTL.
func BucketRecords(name string) string { return "tollgate_" + name }

// Provision creates transport name's buckets if they do not exist and
// binds to them (title names the platform in their descriptions). Under a
// least-privilege deployment the admin user creates them (the transport's
// user may only read and write them).
func Provision(ctx context.Context, js jetstream.JetStream, name, title string, replicas int) (seen, records jetstream.KeyValue, err error) {
	replicas = max(replicas, 1)
	if seen, err = OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketSeen(name), Description: "Tollgate " + title + " transport: requests, events and clicks seen (replay window)",
		History: 1, TTL: SeenTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	}); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if records, err = OpenBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket: BucketRecords(name), Description: "Tollgate " + title + " transport: posted prompts, outcomes and replies, served threads",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas, MaxValueSize: 64 << 10,
	}); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return seen, records, nil
}

// RecordVersion is the schema version of a transport's Records.
const RecordVersion = 1

// Record is what a transport keeps of a message it posted: a prompt
// (prompt.<approval>), another post (outcome.<turn>, reply.<turn>,
// rejected.<hash>), a thread it serves (thread.<hash>: MessageID is the
// thread), or a click whose interaction may get a follow-up
// (click.<decision>, in the seen bucket: App and Token).
type Record struct {
	V       int    `msgpack:"v"`
	Channel string `msgpack:"channel"`
	// MessageID is the posted message's id (Slack's ts).
	MessageID string `msgpack:"message_id,omitempty"`
	// TS is MessageID under the name Slack's records had before
	// message_id: written too, and read when message_id is absent, so
	// records of either version read the same.
	TS string `msgpack:"ts,omitempty"`
	// Prompts only.
	ApprovalID string              `msgpack:"approval_id,omitempty"`
	Tool       string              `msgpack:"tool,omitempty"`
	Digest     string              `msgpack:"digest,omitempty"`
	Kind       schemas.ChannelKind `msgpack:"kind,omitempty"` // of Channel
	Closed     bool                `msgpack:"closed,omitempty"`
	// Clicks only: the interaction's application id and token.
	App   string    `msgpack:"app,omitempty"`
	Token string    `msgpack:"token,omitempty"`
	At    time.Time `msgpack:"at"`
}

// RecordVersion is the version the record was written with.
func (r *Record) RecordVersion() int { return r.V }

// bucket is where a record lives: clicks in the seen bucket (they expire
// with it), everything else in the records bucket.
func (t *Transport[M]) bucket(key string) jetstream.KeyValue {
	if strings.HasPrefix(key, "click.") {
		return t.seen
	}
	return t.records
}

// Record reads record key; nil without error when there is none. A
// record of another version is an error (never guessed).
func (t *Transport[M]) Record(ctx context.Context, key string) (*Record, uint64, error) {
	return ReadRecord(ctx, t.bucket(key), key)
}

// ReadRecord reads Record key of kv (Get), its MessageID taken from TS
// when only that is set (a record Slack wrote before message_id).
func ReadRecord(ctx context.Context, kv jetstream.KeyValue, key string) (*Record, uint64, error) {
	r, rev, err := Get[Record](ctx, kv, key, RecordVersion)
	if r != nil && r.MessageID == "" {
		r.MessageID = r.TS
	}
	return r, rev, err
}

// PutRecord creates (rev 0) or compare-and-sets record key; ErrWritten
// when another write came first.
func (t *Transport[M]) PutRecord(ctx context.Context, key string, r *Record, rev uint64) error {
	r.V, r.TS = RecordVersion, r.MessageID
	return Put(ctx, t.bucket(key), key, r, rev)
}

// DecisionPrefix starts the id of every decision the transport publishes:
// "d-<name>-".
func (t *Transport[M]) DecisionPrefix() string { return "d-" + t.cfg.Name + "-" }

// DecisionID is the id of the decision a click identified by parts (who,
// on what, with which option, which click) publishes: DecisionPrefix and
// 24 hex characters of the SHA-256 of the parts, each ended by a NUL but
// the last, so that the platform's retry of the same click is the same
// decision.
func (t *Transport[M]) DecisionID(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return t.DecisionPrefix() + hex.EncodeToString(h[:12])
}
