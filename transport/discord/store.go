package discord

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/schemas"
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
// (the transport's user may only read and write them): then a create
// refused for permissions is not an error as long as the bucket exists.
func Provision(ctx context.Context, js jetstream.JetStream, replicas int) (seen, records jetstream.KeyValue, err error) {
	if replicas < 1 {
		replicas = 1
	}
	open := func(cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if err == nil {
			return kv, nil
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("discord: bucket %s: %w", cfg.Bucket, err)
		}
		kv, err = js.CreateKeyValue(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("discord: create bucket %s: %w", cfg.Bucket, err)
		}
		return kv, nil
	}
	if seen, err = open(jetstream.KeyValueConfig{
		Bucket: BucketSeen, Description: "Tollgate Discord transport: interaction ids seen (replay window)",
		History: 1, TTL: SeenTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	}); err != nil {
		return nil, nil, err
	}
	if records, err = open(jetstream.KeyValueConfig{
		Bucket: BucketRecords, Description: "Tollgate Discord transport: posted prompts, outcomes, replies and clicks",
		History: 1, Storage: jetstream.FileStorage, Replicas: replicas, MaxValueSize: 64 << 10,
	}); err != nil {
		return nil, nil, err
	}
	return seen, records, nil
}

// hashKey is a KV-safe key for arbitrary parts.
func hashKey(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return prefix + "." + hex.EncodeToString(h.Sum(nil))[:40]
}

// markSeen creates key in the seen bucket; it reports false when the key
// already exists (seen before).
func (t *Transport) markSeen(ctx context.Context, key string) (bool, error) {
	_, err := t.seen.Create(ctx, key, []byte{1})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	return false, fmt.Errorf("discord: record %s: %w", key, err)
}

// unmarkSeen removes a seen record after the work it guarded failed before
// it was answered, so that the interaction can be sent again.
func (t *Transport) unmarkSeen(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = t.seen.Purge(ctx, key)
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

func promptKey(approvalID string) string { return "prompt." + approvalID }

// bucket is where a record lives: clicks in the seen bucket (they expire
// with it), everything else in the records bucket.
func (t *Transport) bucket(key string) jetstream.KeyValue {
	if strings.HasPrefix(key, "click.") {
		return t.seen
	}
	return t.records
}

// getPost reads a record; nil without error when there is none. A record
// of another version is an error (never guessed).
func (t *Transport) getPost(ctx context.Context, key string) (*post, uint64, error) {
	e, err := t.bucket(key).Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("discord: read %s: %w", key, err)
	}
	var p post
	if err := msgpack.Unmarshal(e.Value(), &p); err != nil {
		return nil, 0, schemas.Errorf(schemas.CodeMalformed, "discord: record %s: %w", key, err)
	}
	if p.V != recordVersion {
		return nil, 0, schemas.Errorf(schemas.CodeSchemaVersionUnsupported, "discord: record %s has version %d", key, p.V)
	}
	return &p, e.Revision(), nil
}

// putPost creates (rev 0) or compare-and-sets a record; errWritten when
// another write came first.
func (t *Transport) putPost(ctx context.Context, key string, p *post, rev uint64) error {
	p.V = recordVersion
	b, err := msgpack.Marshal(p)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = t.bucket(key).Create(ctx, key, b)
	} else {
		_, err = t.bucket(key).Update(ctx, key, b, rev)
	}
	var api *jetstream.APIError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch),
		errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return errWritten
	}
	return fmt.Errorf("discord: write %s: %w", key, err)
}

// errWritten: a create found the key, or a compare-and-set lost: another
// worker wrote the record first.
var errWritten = errors.New("discord: record written by another worker")

// approval reads an approval record; nil without error when absent.
func (t *Transport) approval(ctx context.Context, id string) (*schemas.ApprovalRecord, error) {
	if !schemas.ValidKey(id) {
		return nil, nil
	}
	e, err := t.approvals.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discord: read approval %s: %w", id, err)
	}
	rec, _, err := schemas.DecodeApproval(e.Value())
	if err != nil || rec == nil {
		return nil, nil
	}
	return rec, nil
}
