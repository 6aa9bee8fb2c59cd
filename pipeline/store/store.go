// Package store is typed access to Tollgate's KV buckets: every value is a
// versioned schemas record, every write of an existing key is a
// compare-and-set on its revision.
//
// Conflicts are reported as ErrExists (create of a key that is there) and
// ErrConflict (update at a stale revision). Both JetStream error shapes of a
// failed compare-and-set (ErrKeyExists, code 10071 on a single server, and
// ErrKeyRevisionMismatch, code 10164 on a replicated bucket) map to these, so
// callers never look at JetStream codes. (The JetStream error stays in the
// chain, for logs and tests.) On a replicated bucket both shapes occur:
// 10164 while the leader still has a write of the key in flight, 10071
// otherwise.
//
// Retention: records that have ended leave their bucket a retention period
// after they ended (Store.Retain), by JetStream's per-message TTL (the
// buckets allow it: topology.Config.BucketStreams). A terminal batch and an
// idle session are written with the TTL as they end (Bucket.Ended), and so
// are an execution claim as its result is recorded (its batch record takes
// the result over in the same step; see batch.Engine.ExecuteIn for
// why that is safe) and an approval as it is decided (docs/operations.md,
// "Retention", says what that costs a batch that waits longer than the
// retention for a sibling). Records that an earlier version wrote
// without a TTL are retired (Bucket.Retire) when their batch ends. The
// buckets keep one revision per key (topology.Config.Buckets), so no
// earlier revision (a pending approval) is left to reappear when the TTL'd
// one expires. A write without a TTL (the record is live again: a session
// acquired anew) keeps the key for good. docs/operations.md, "Retention",
// states the rules that make this safe.
package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
)

// Sentinel errors.
var (
	ErrNotFound = errors.New("store: key not found")
	ErrExists   = errors.New("store: key already exists")
	ErrConflict = errors.New("store: revision conflict")
)

// Store wraps the five buckets.
type Store struct {
	Approvals Bucket[schemas.ApprovalRecord, *schemas.ApprovalRecord]
	Batches   Batches
	Sessions  Bucket[schemas.SessionRecord, *schemas.SessionRecord]
	Claims    Bucket[schemas.ExecutionClaim, *schemas.ExecutionClaim]
	// Grants and GrantIndexes share bucket tollgate_grants: grants under
	// "g-" keys, their indexes under "gi-" keys (schemas.GrantIndexKey).
	// Grants end by expiry or revocation and stay for audit (no TTL).
	Grants       Bucket[schemas.Grant, *schemas.Grant]
	GrantIndexes Bucket[schemas.GrantIndex, *schemas.GrantIndex]
}

// DefaultRetention is how long ended records stay in KV unless configured
// otherwise (tollgate.Config.Retention): as long as the streams keep their
// messages by default (topology.DefaultConfig().MaxAge).
const DefaultRetention = 30 * 24 * time.Hour

// New returns a Store over b that keeps every record (no retention; see
// Retain). b must hold the turn-log streams (topology.OpenBuckets): a
// Store without them could not find any batch created since; New panics
// on a b without them, a wiring error.
func New(b topology.Buckets) *Store {
	if len(b.TurnLogs) == 0 || b.JS == nil {
		panic("store: New needs the turn-log streams and their JetStream (topology.OpenBuckets)")
	}
	return &Store{
		Approvals: Bucket[schemas.ApprovalRecord, *schemas.ApprovalRecord]{KV: b.Approvals,
			Ended: func(a *schemas.ApprovalRecord) bool { return a.Status != schemas.ApprovalPending }},
		Batches: Batches{
			Bucket: Bucket[schemas.BatchRecord, *schemas.BatchRecord]{KV: b.Batches,
				Decode: schemas.DecodeBucketedBatch, // both versions (schemas.BatchRecordV1), marked as kept here
				Ended:  func(r *schemas.BatchRecord) bool { return r.State.Terminal() }},
			Log: BatchLog{Log: turnlog.Bind(b.JS, b.TurnLogs)},
		},
		Sessions: Bucket[schemas.SessionRecord, *schemas.SessionRecord]{KV: b.Sessions,
			Ended: func(r *schemas.SessionRecord) bool { return r.Active == "" && len(r.Queue) == 0 }},
		Claims: Bucket[schemas.ExecutionClaim, *schemas.ExecutionClaim]{KV: b.Claims,
			Ended: func(c *schemas.ExecutionClaim) bool { return c.Result != nil }},
		Grants:       Bucket[schemas.Grant, *schemas.Grant]{KV: b.Grants},
		GrantIndexes: Bucket[schemas.GrantIndex, *schemas.GrantIndex]{KV: b.Grants},
	}
}

// Retain makes ended records leave KV d after they ended: terminal batches,
// idle sessions, claims with a result and decided approvals from their
// write; records an earlier version ended without a TTL from their Retire.
// Every write of every bucket is published through js, the buckets'
// JetStream (Bucket.JS). d is rounded down to whole seconds (the TTL's
// resolution); less than a second keeps every record. Call it before the
// store is used: it is not safe to call concurrently with writes.
func (s *Store) Retain(js jetstream.JetStream, d time.Duration) {
	d = d.Truncate(time.Second)
	if d < time.Second {
		d = 0
	}
	s.Approvals.TTL, s.Batches.TTL, s.Sessions.TTL, s.Claims.TTL = d, d, d, d
	s.Approvals.JS, s.Batches.JS, s.Sessions.JS, s.Claims.JS = js, js, js, js
	s.Grants.JS, s.GrantIndexes.JS = js, js
	s.Approvals.raw = &rawReader{js: js, bucket: s.Approvals.KV.Bucket()}
	s.Batches.raw = &rawReader{js: js, bucket: s.Batches.KV.Bucket()}
	s.Sessions.raw = &rawReader{js: js, bucket: s.Sessions.KV.Bucket()}
	s.Claims.raw = &rawReader{js: js, bucket: s.Claims.KV.Bucket()}
}

// rawReader reads a bucket's stored messages with their headers (which
// KeyValue.Get does not return), through the bucket's stream, looked up
// once.
type rawReader struct {
	js     jetstream.JetStream
	bucket string
	mu     sync.Mutex
	stream jetstream.Stream
}

// last returns the message that holds key's latest revision, or
// jetstream.ErrMsgNotFound.
func (r *rawReader) last(ctx context.Context, key string) (*jetstream.RawStreamMsg, error) {
	r.mu.Lock()
	s := r.stream
	r.mu.Unlock()
	if s == nil {
		var err error
		if s, err = r.js.Stream(ctx, "KV_"+r.bucket); err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.stream = s
		r.mu.Unlock()
	}
	return s.GetLastMsgForSubject(ctx, "$KV."+r.bucket+"."+key)
}

// Bucket is a KV bucket holding records of type T.
type Bucket[T any, P schemas.Ptr[T]] struct {
	KV jetstream.KeyValue
	// Decode replaces schemas.Decode[T] when set: the approvals bucket uses
	// it to read older record versions through the one compatibility path
	// (pipeline/legacy).
	Decode func([]byte) (*T, error)
	// TTL, when positive, is how long an ended record stays: a write by
	// Create or Update of a record for which Ended is true, and Retire,
	// carry it (see the package doc). Zero keeps every record.
	TTL time.Duration
	// JS, when set, publishes Create's, Update's and Retire's writes
	// (required with TTL), each alone. Nil: they go through KV.
	JS jetstream.JetStream
	// Ended reports whether a record has ended, so that writing it starts
	// its TTL; nil: records end only by Retire.
	Ended func(*T) bool
	// raw, when set (Store.Retain), lets Retire see whether the latest
	// revision already carries a TTL.
	raw *rawReader
}

// ttlFor is the TTL a write of rec carries: zero unless it has ended.
func (b Bucket[T, P]) ttlFor(rec P) time.Duration {
	if b.TTL > 0 && b.Ended != nil && b.Ended((*T)(rec)) {
		return b.TTL
	}
	return 0
}

// isConflict reports whether err is a failed compare-and-set, in either of
// its JetStream shapes (see the package doc).
func isConflict(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant))
}

// put writes data at key through b.JS, only if the key's latest revision
// is rev (0: the key has no message), with the TTL ttl when positive; the
// bucket's one revision per key (history 1) makes it replace the key's
// only earlier revision. It is the publish nats.go's KeyValue.Update
// makes, with the compare-and-set and the TTL as headers.
func (b Bucket[T, P]) put(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration) (uint64, error) {
	return b.write(ctx, key, data, rev, ttl, "")
}

// write is put, marking the message with RewriteHeader when rewrite is not
// empty.
func (b Bucket[T, P]) write(ctx context.Context, key string, data []byte, rev uint64, ttl time.Duration, rewrite string) (uint64, error) {
	subject := "$KV." + b.KV.Bucket() + "." + key
	// As nats.go's KV puts: under the JetStream API prefix, where the
	// buckets are another account's (deploy/nats/least-privilege.conf).
	if p := strings.TrimSuffix(b.JS.Options().APIPrefix, "."); p != "" && p+"." != jetstream.DefaultAPIPrefix {
		subject = p + "." + subject
	}
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if ttl > 0 {
		m.Header.Set(jetstream.MsgTTLHeader, ttl.String())
	}
	if rewrite != "" {
		m.Header.Set(RewriteHeader, rewrite)
	}
	// The writer's trace context, when it has one: a revision that is a
	// fact another stage acts on (an approval's decision, which the
	// redriver consumes) continues the turn's trace, as a published event
	// did.
	m.Header = tracing.Inject(ctx, m.Header)
	ack, err := b.JS.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// DecodeValue decodes a stored value as Get does (with Decode if set).
func (b Bucket[T, P]) DecodeValue(data []byte) (*T, error) { return b.decode(data) }

func (b Bucket[T, P]) decode(data []byte) (*T, error) {
	if b.Decode != nil {
		return b.Decode(data)
	}
	return schemas.Decode[T, P](data)
}

// Get returns the record at key and its revision. It fails with ErrNotFound
// (absent or deleted), or with a *schemas.Error when the stored bytes do not
// decode (malformed or an unsupported version: never guessed).
func (b Bucket[T, P]) Get(ctx context.Context, key string) (*T, uint64, error) {
	e, err := b.KV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, fmt.Errorf("get %s/%s: %w", b.KV.Bucket(), key, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("get %s/%s: %w", b.KV.Bucket(), key, err)
	}
	v, err := b.decode(e.Value())
	if err != nil {
		return nil, e.Revision(), fmt.Errorf("decode %s/%s@%d: %w", b.KV.Bucket(), key, e.Revision(), err)
	}
	return v, e.Revision(), nil
}

// Create writes rec at key only if key is absent (or deleted). It fails with
// ErrExists otherwise.
func (b Bucket[T, P]) Create(ctx context.Context, key string, rec P) (uint64, error) {
	data, err := schemas.Encode(rec)
	if err != nil {
		return 0, err
	}
	ttl := b.ttlFor(rec)
	if b.JS != nil {
		rev, err := b.put(ctx, key, data, 0, ttl)
		switch {
		case err == nil:
			return rev, nil
		case !isConflict(err):
			return 0, fmt.Errorf("create %s/%s: %w", b.KV.Bucket(), key, err)
		}
		// The key has a message: a record (ErrExists below) or a delete
		// marker, over which KeyValue.Create writes.
	}
	var opts []jetstream.KVCreateOpt
	if ttl > 0 {
		opts = append(opts, jetstream.KeyTTL(ttl))
	}
	rev, err := b.KV.Create(ctx, key, data, opts...)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("create %s/%s: %w (%w)", b.KV.Bucket(), key, ErrExists, err)
	}
	if err != nil {
		return 0, fmt.Errorf("create %s/%s: %w", b.KV.Bucket(), key, err)
	}
	return rev, nil
}

// Update writes rec at key only if the key's latest revision is rev. It
// fails with ErrConflict otherwise.
func (b Bucket[T, P]) Update(ctx context.Context, key string, rec P, rev uint64) (uint64, error) {
	data, err := schemas.Encode(rec)
	if err != nil {
		return 0, err
	}
	var n uint64
	if b.JS != nil {
		n, err = b.put(ctx, key, data, rev, b.ttlFor(rec))
	} else {
		n, err = b.KV.Update(ctx, key, data, rev)
	}
	if isConflict(err) {
		return 0, fmt.Errorf("update %s/%s@%d: %w (%w)", b.KV.Bucket(), key, rev, ErrConflict, err)
	}
	if err != nil {
		return 0, fmt.Errorf("update %s/%s@%d: %w", b.KV.Bucket(), key, rev, err)
	}
	return n, nil
}

// Mutate applies fn to the record at key under compare-and-set, retrying on
// conflict until fn's result is written or fn returns an error (returned as
// is) or ErrSkip (nothing written; Mutate returns the current record). A
// missing key fails with ErrNotFound before fn is called.
func (b Bucket[T, P]) Mutate(ctx context.Context, key string, fn func(P) error) (P, uint64, error) {
	return mutate(ctx, b.get(key), b.update(key), fn)
}

// MutateFrom is Mutate starting from cur at revision rev, the record as the
// caller just read or wrote it, which saves the first read. fn is applied
// to cur itself (the caller must not use cur afterwards, only the record
// returned). If the compare-and-set finds a newer revision, it goes on as
// Mutate does, from a fresh read. A nil cur or a zero rev is plain Mutate.
func (b Bucket[T, P]) MutateFrom(ctx context.Context, key string, cur P, rev uint64, fn func(P) error) (P, uint64, error) {
	return mutateFrom(ctx, b.get(key), b.update(key), cur, rev, fn)
}

func (b Bucket[T, P]) get(key string) func(context.Context) (P, uint64, error) {
	return func(ctx context.Context) (P, uint64, error) {
		v, rev, err := b.Get(ctx, key)
		return P(v), rev, err
	}
}

func (b Bucket[T, P]) update(key string) func(context.Context, P, uint64) (uint64, error) {
	return func(ctx context.Context, rec P, rev uint64) (uint64, error) { return b.Update(ctx, key, rec, rev) }
}

// mutate is Mutate's loop over a record's get and its compare-and-set
// update (ErrConflict on a stale revision), for every kind of record
// store.
func mutate[P any](ctx context.Context, get func(context.Context) (P, uint64, error), update func(context.Context, P, uint64) (uint64, error), fn func(P) error) (P, uint64, error) {
	var zero P
	for {
		p, rev, err := get(ctx)
		if err != nil {
			return zero, 0, err
		}
		if err := fn(p); errors.Is(err, ErrSkip) {
			return p, rev, nil
		} else if err != nil {
			return p, rev, err
		}
		n, err := update(ctx, p, rev)
		if errors.Is(err, ErrConflict) {
			if ctx.Err() != nil {
				return zero, 0, ctx.Err()
			}
			continue
		}
		if err != nil {
			return zero, 0, err
		}
		return p, n, nil
	}
}

// mutateFrom is MutateFrom's rule, as mutate is Mutate's.
func mutateFrom[P comparable](ctx context.Context, get func(context.Context) (P, uint64, error), update func(context.Context, P, uint64) (uint64, error), cur P, rev uint64, fn func(P) error) (P, uint64, error) {
	var zero P
	if cur == zero || rev == 0 {
		return mutate(ctx, get, update, fn)
	}
	if err := fn(cur); errors.Is(err, ErrSkip) {
		return cur, rev, nil
	} else if err != nil {
		return cur, rev, err
	}
	n, err := update(ctx, cur, rev)
	switch {
	case errors.Is(err, ErrConflict):
		return mutate(ctx, get, update, fn)
	case err != nil:
		return zero, 0, err
	}
	return cur, n, nil
}

// Retire starts the TTL of the record at key: its latest value is written
// again, as it is (it is not decoded), with the bucket's TTL, by
// compare-and-set on the revision read, and read again on a conflict. The
// key's earlier revisions are rolled up. A missing key, and a bucket
// without a TTL, are left alone; so is a latest revision that was written
// with a TTL already (an ended record: a claim with its result, or one
// retired before), whose TTL runs from that write: retiring costs a read,
// not a write, then. The rewrite is marked (RewriteHeader "retire"): it
// repeats a record, and a reader of the bucket's stream that takes a
// revision for a new fact (an approval's decision, DecidedOf) passes it
// over.
func (b Bucket[T, P]) Retire(ctx context.Context, key string) error {
	if b.TTL <= 0 {
		return nil
	}
	for {
		data, rev, found, err := b.latest(ctx, key)
		switch {
		case err != nil:
			return fmt.Errorf("retire %s/%s: %w", b.KV.Bucket(), key, err)
		case !found:
			return nil
		}
		_, err = b.write(ctx, key, data, rev, b.TTL, RewriteRetire)
		switch {
		case err == nil:
			return nil
		case !isConflict(err):
			return fmt.Errorf("retire %s/%s@%d: %w", b.KV.Bucket(), key, rev, err)
		case ctx.Err() != nil:
			return ctx.Err()
		}
	}
}

// latest reads key's latest value and revision for Retire: found is false
// for a missing or deleted key, and for one whose latest revision carries a
// TTL already (seen only through raw; without it every value is found).
func (b Bucket[T, P]) latest(ctx context.Context, key string) (data []byte, rev uint64, found bool, err error) {
	if b.raw == nil {
		e, err := b.KV.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return nil, 0, false, nil
		}
		if err != nil {
			return nil, 0, false, err
		}
		return e.Value(), e.Revision(), true, nil
	}
	m, err := b.raw.last(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, 0, false, nil
	case err != nil:
		return nil, 0, false, err
	case m.Header.Get(kvOperationHeader) != "": // a delete or purge marker
		return nil, 0, false, nil
	case m.Header.Get(jetstream.MsgTTLHeader) != "":
		return nil, 0, false, nil
	}
	return m.Data, m.Sequence, true, nil
}

// kvOperationHeader marks a KV delete or purge (nats.go's KV does not
// export its name).
const kvOperationHeader = "KV-Operation"

// ErrSkip, returned by a Mutate function, means "no change needed".
var ErrSkip = errors.New("store: no change")
