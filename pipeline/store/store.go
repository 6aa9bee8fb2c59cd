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
package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Sentinel errors.
var (
	ErrNotFound = errors.New("store: key not found")
	ErrExists   = errors.New("store: key already exists")
	ErrConflict = errors.New("store: revision conflict")
)

// Store wraps the four buckets.
type Store struct {
	Approvals Bucket[schemas.ApprovalRecord, *schemas.ApprovalRecord]
	Batches   Bucket[schemas.BatchRecord, *schemas.BatchRecord]
	Sessions  Bucket[schemas.SessionRecord, *schemas.SessionRecord]
	Claims    Bucket[schemas.ExecutionClaim, *schemas.ExecutionClaim]
}

// New returns a Store over b.
func New(b topology.Buckets) *Store {
	return &Store{
		Approvals: Bucket[schemas.ApprovalRecord, *schemas.ApprovalRecord]{KV: b.Approvals},
		Batches:   Bucket[schemas.BatchRecord, *schemas.BatchRecord]{KV: b.Batches},
		Sessions:  Bucket[schemas.SessionRecord, *schemas.SessionRecord]{KV: b.Sessions},
		Claims:    Bucket[schemas.ExecutionClaim, *schemas.ExecutionClaim]{KV: b.Claims},
	}
}

// Bucket is a KV bucket holding records of type T.
type Bucket[T any, P schemas.Ptr[T]] struct {
	KV jetstream.KeyValue
	// Decode replaces schemas.Decode[T] when set: the approvals bucket uses
	// it to read older record versions through the one compatibility path
	// (pipeline/legacy).
	Decode func([]byte) (*T, error)
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
	rev, err := b.KV.Create(ctx, key, data)
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
	n, err := b.KV.Update(ctx, key, data, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
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
	for {
		cur, rev, err := b.Get(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		p := P(cur)
		if err := fn(p); errors.Is(err, ErrSkip) {
			return p, rev, nil
		} else if err != nil {
			return p, rev, err
		}
		n, err := b.Update(ctx, key, p, rev)
		if errors.Is(err, ErrConflict) {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		return p, n, nil
	}
}

// MutateFrom is Mutate starting from cur at revision rev, the record as the
// caller just read or wrote it, which saves the first read. fn is applied
// to cur itself (the caller must not use cur afterwards, only the record
// returned). If the compare-and-set finds a newer revision, it goes on as
// Mutate does, from a fresh read. A nil cur or a zero rev is plain Mutate.
func (b Bucket[T, P]) MutateFrom(ctx context.Context, key string, cur P, rev uint64, fn func(P) error) (P, uint64, error) {
	if cur == nil || rev == 0 {
		return b.Mutate(ctx, key, fn)
	}
	if err := fn(cur); errors.Is(err, ErrSkip) {
		return cur, rev, nil
	} else if err != nil {
		return cur, rev, err
	}
	n, err := b.Update(ctx, key, cur, rev)
	switch {
	case errors.Is(err, ErrConflict):
		return b.Mutate(ctx, key, fn)
	case err != nil:
		return nil, 0, err
	}
	return cur, n, nil
}

// ErrSkip, returned by a Mutate function, means "no change needed".
var ErrSkip = errors.New("store: no change")
