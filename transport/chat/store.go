// Package chat is Tollgate's chat transport framework, as a router is to
// its handlers: Transport owns what every chat platform (transport/slack,
// transport/discord) does the same way, and a platform implements
// Platform (its client and its renderer) on top.
//
// Transport owns the transport's KV buckets (tollgate_<name>_seen for
// replay records and clicks, tollgate_<name> for what it posted), its
// counters (tollgate_<name>_posts_total{kind}, one meaning per kind;
// tollgate_<name>_refused_total{reason}), its consumers and the five
// handlers with their once records: a pending approval of its own turns
// prompted once, the prompt closed once in place with the status, the
// decider and their note, outcomes and the planner's replies posted once
// where their audience admits the channel, an approver's rejection shown
// to its decider.
//
// Where each comes from: a turn's requests and outcome from its turn
// log's awaiting and outcome events (consumers
// transport-<name>-outcome-<i>, pipeline/outcomes); an approval's
// decision from its decided revision in KV tollgate_approvals (consumer
// transport-<name>-decided on KV_tollgate_approvals: every decision the
// bucket holds, then each new one; pipeline/decisions); the planner's
// replies, the approver's rejections, and the requests and outcomes an
// earlier version published, from the durable consumer transport-<name>
// on TOLLGATE_EVENTS. A published approval.decided is not read: the
// bucket holds every decision, and the approver's answer to a repeated
// decision (DecidedEvent.Repeat) repeats one the prompt shows already.
//
// Order: a decision that comes before its prompt is posted is not lost. A
// prompt is posted only for an approval the bucket holds pending, and
// once the prompt's record is written the approval is read again: decided
// by then (its decision may have found no prompt to close), the prompt is
// closed at once.
//
// For the platform's inbound side it checks signed
// requests (ReadSigned), binds clicks to prompts (Check), applies the
// one "still decidable" rule (Undecidable, after
// schemas.ApprovalRecord.Decidable), and builds and publishes decisions
// and inbound messages. Package internal/chatcmd runs a transport's
// process (its flags, secrets, consumer, loops and HTTP handler).
//
// Each function is safe for concurrent use; errors wrap the JetStream
// error, and a record that cannot be read is a coded error
// (schemas.CodeMalformed, schemas.CodeSchemaVersionUnsupported), never
// guessed. Package chattest is the conformance suite a platform runs.
package chat

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/schemas"
)

// OpenBucket binds to the bucket cfg names, creating it with cfg when it
// does not exist. Under a least-privilege deployment the admin user
// creates it (the transport's user may only read and write it).
func OpenBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// HashKey is a KV-safe key for arbitrary parts: prefix + "." + 40 hex
// characters of their SHA-256.
func HashKey(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return prefix + "." + hex.EncodeToString(h.Sum(nil))[:40]
}

// MarkSeen creates key in kv; it reports false when the key already
// exists (seen before).
func MarkSeen(ctx context.Context, kv jetstream.KeyValue, key string) (bool, error) {
	_, err := kv.Create(ctx, key, []byte{1})
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	return false, fmt.Errorf("record %s: %w", key, err)
}

// Unmark removes key (best effort, within 2 seconds): a seen record whose
// work failed before it was answered, so that a retry is handled.
func Unmark(kv jetstream.KeyValue, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = kv.Purge(ctx, key)
}

// ErrWritten: a create found the key, or a compare-and-set lost: another
// worker wrote the record first.
var ErrWritten = errors.New("chat: record written by another worker")

// Versioned is a KV record that carries its schema version.
type Versioned interface {
	// RecordVersion is the version the record was written with.
	RecordVersion() int
}

// Get reads the msgpack record key of kv into a new T; nil without error
// when there is none. A record of a version other than want is an error.
func Get[T any, P interface {
	*T
	Versioned
}](ctx context.Context, kv jetstream.KeyValue, key string, want int) (P, uint64, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", key, err)
	}
	p := P(new(T))
	if err := msgpack.Unmarshal(e.Value(), p); err != nil {
		return nil, 0, schemas.Errorf(schemas.CodeMalformed, "record %s: %w", key, err)
	}
	if v := p.RecordVersion(); v != want {
		return nil, 0, schemas.Errorf(schemas.CodeSchemaVersionUnsupported, "record %s has version %d", key, v)
	}
	return p, e.Revision(), nil
}

// Put writes v (msgpack) as key: a create when rev is 0, else a
// compare-and-set on rev. ErrWritten when another write came first.
func Put(ctx context.Context, kv jetstream.KeyValue, key string, v any, rev uint64) error {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = kv.Create(ctx, key, b)
	} else {
		_, err = kv.Update(ctx, key, b, rev)
	}
	var api *jetstream.APIError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch),
		errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return ErrWritten
	}
	return fmt.Errorf("write %s: %w", key, err)
}

// Approval reads approval id from the approvals bucket; nil without error
// when it is absent, its id is not a valid key, or it cannot be decoded
// (a click naming it is then refused as not matching).
func Approval(ctx context.Context, approvals jetstream.KeyValue, id string) (*schemas.ApprovalRecord, error) {
	if !schemas.ValidKey(id) {
		return nil, nil
	}
	e, err := approvals.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read approval %s: %w", id, err)
	}
	rec, _, err := schemas.DecodeApproval(e.Value())
	if err != nil || rec == nil {
		return nil, nil
	}
	return rec, nil
}
