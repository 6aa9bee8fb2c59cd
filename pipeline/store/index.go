package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/btree"
	"github.com/nats-io/nats.go/jetstream"
)

// Index is a process's projection of a KV bucket: one entry per key,
// derived from the key's latest value, kept in memory and fed by one
// watch of the bucket (the latest value of every key first, then every
// write as it is made). It is built from the bucket's stream when the
// process starts, like every projection, so a restarted process or a
// second replica builds the same index on its own, and no request reads
// the bucket to find its keys.
//
// What an entry holds is the caller's (Derive): a whole record, or the few
// fields a list is filtered and ordered by, so that a list reads only the
// records of the page it answers.
type Index[E any] struct {
	kv     jetstream.KeyValue
	derive Derive[E]
	name   string
	log    *slog.Logger

	mu      sync.Mutex
	entries map[string]E
	ordered *btree.BTreeG[E] // the entries in OrderedBy's order; nil without it
	applied uint64           // the bucket stream's sequence the index holds every write up to
	ready   bool             // the initial values are in
	changed chan struct{}    // closed (and replaced) at every change of applied or ready
	ended   error            // the watch ended: the index no longer follows the bucket
	done    chan struct{}    // closed when the watch ends
	stop    func() error
}

// Derive is an Index's entry of key from its latest value; keep false
// (a value the index does not hold, or one that does not decode) leaves
// the key out. A deleted or purged key is always left out.
type Derive[E any] func(key string, value []byte) (e E, keep bool)

// IndexOption is an optional setting of NewIndex.
type IndexOption[E any] func(*Index[E])

// OrderedBy keeps the index's entries also in less's order, for Ascend:
// a page of a list is then found by a seek, not a scan of every entry.
// less must be a strict total order over the entries the index holds at
// once (break ties by key), and an entry's place must depend only on the
// entry, which the index never changes.
func OrderedBy[E any](less func(a, b E) bool) IndexOption[E] {
	return func(x *Index[E]) { x.ordered = btree.NewG(32, less) }
}

// NewIndex starts following kv (name, for errors and logs). The index
// follows until Stop is called or the connection closes.
func NewIndex[E any](ctx context.Context, kv jetstream.KeyValue, name string, derive Derive[E], log *slog.Logger, opts ...IndexOption[E]) (*Index[E], error) {
	// The stream's last sequence before the watch starts: the initial
	// values are every key's latest value as of then, so once they are in
	// the index holds every write up to it (even when the stream's last
	// messages have since been removed by their TTL).
	last, err := lastSeq(ctx, kv)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(context.Background())
	if err != nil {
		return nil, fmt.Errorf("store: watch %s: %w", name, err)
	}
	x := &Index[E]{kv: kv, derive: derive, name: name, log: log, entries: map[string]E{}, changed: make(chan struct{}), done: make(chan struct{}), stop: w.Stop}
	for _, o := range opts {
		o(x)
	}
	go x.follow(w.Updates(), last)
	return x, nil
}

// lastSeq is the sequence of the last write the bucket's stream has.
func lastSeq(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("store: bucket %s status: %w", kv.Bucket(), err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, fmt.Errorf("store: bucket %s status has no stream info", kv.Bucket())
	}
	return bs.StreamInfo().State.LastSeq, nil
}

// follow applies each entry of the watch; nil marks the end of the
// initial values.
func (x *Index[E]) follow(updates <-chan jetstream.KeyValueEntry, startLast uint64) {
	for e := range updates {
		x.mu.Lock()
		if e == nil {
			x.ready, x.applied = true, max(x.applied, startLast)
		} else {
			x.applyLocked(e)
		}
		close(x.changed)
		x.changed = make(chan struct{})
		x.mu.Unlock()
	}
	x.mu.Lock()
	x.ended = fmt.Errorf("store: the watch of %s ended", x.name)
	close(x.changed)
	x.changed = make(chan struct{})
	x.mu.Unlock()
	close(x.done)
}

func (x *Index[E]) applyLocked(e jetstream.KeyValueEntry) {
	x.applied = max(x.applied, e.Revision())
	if old, ok := x.entries[e.Key()]; ok {
		delete(x.entries, e.Key())
		if x.ordered != nil {
			x.ordered.Delete(old)
		}
	}
	if e.Operation() != jetstream.KeyValuePut {
		return
	}
	if v, keep := x.derive(e.Key(), e.Value()); keep {
		x.entries[e.Key()] = v
		if x.ordered != nil {
			x.ordered.ReplaceOrInsert(v)
		}
	}
}

// ErrIndexBehind: Sync's wait ran out before the index caught up.
var ErrIndexBehind = errors.New("store: the index is behind its bucket")

// Sync waits until the index holds every write the bucket had when it
// was called, for at most wait (ErrIndexBehind then; or ctx's error, or
// the end of the watch). Whatever it returns, the index answers with
// what it holds.
func (x *Index[E]) Sync(ctx context.Context, wait time.Duration) error {
	want, err := lastSeq(ctx, x.kv)
	if err != nil {
		return err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		x.mu.Lock()
		done, ended, changed, applied := x.ready && x.applied >= want, x.ended, x.changed, x.applied
		x.mu.Unlock()
		switch {
		case done:
			return nil
		case ended != nil:
			return ended
		}
		select {
		case <-changed:
		case <-t.C:
			return fmt.Errorf("%w: %s (%d of %d)", ErrIndexBehind, x.name, applied, want)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// All returns the entries the index holds, in no order. Entries are
// shared: callers must not change what they point to.
func (x *Index[E]) All() []E {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]E, 0, len(x.entries))
	for _, e := range x.entries {
		out = append(out, e)
	}
	return out
}

// Each calls fn with every entry, in no order, while the index holds its
// lock: fn must be quick and must not call the index.
func (x *Index[E]) Each(fn func(key string, e E)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k, e := range x.entries {
		fn(k, e)
	}
}

// Ascend calls fn with every entry not less than from, in OrderedBy's
// order, until fn returns false, while the index holds its lock: fn must
// be quick and must not call the index. It panics on an index made
// without OrderedBy (a wiring mistake, not a runtime condition).
func (x *Index[E]) Ascend(from E, fn func(e E) bool) {
	if x.ordered == nil {
		panic("store: Ascend on the index of " + x.name + ", which is not OrderedBy")
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ordered.AscendGreaterOrEqual(from, fn)
}

// Has reports whether the index holds an entry of key.
func (x *Index[E]) Has(key string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.entries[key]
	return ok
}

// Current reports, without waiting, whether the index holds the bucket's
// initial values (every key's latest value when it started) and still
// follows it.
func (x *Index[E]) Current() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ready && x.ended == nil
}

// Done is closed when the index stops following the bucket (Stop, or the
// watch ended).
func (x *Index[E]) Done() <-chan struct{} { return x.done }

// Len is how many entries the index holds.
func (x *Index[E]) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.entries)
}

// Stop stops following the bucket.
func (x *Index[E]) Stop() error { return x.stop() }
