package web

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// syncWait bounds how long a page waits for the pending index to catch up
// with the approvals bucket before it is served from what the index holds.
const syncWait = 2 * time.Second

// pendingIndex is the process's projection of the approvals bucket: every
// pending approval, by id (a store.Index), so that no page load reads the
// bucket.
//
// It holds records as stored: who may decide one is not its business (the
// inbox applies policy.Policy.MayDecideApproval to what it shows).
type pendingIndex struct {
	*store.Index[*pendingEntry]
}

// startPendingIndex starts following kv; decode reads a stored value (as
// the store does). The index follows until stop is called or the
// connection closes.
func startPendingIndex(ctx context.Context, kv jetstream.KeyValue, decode func([]byte) (*schemas.ApprovalRecord, error), log *slog.Logger) (*pendingIndex, error) {
	x, err := store.NewIndex(ctx, kv, "the approvals", func(key string, value []byte) (*pendingEntry, bool) {
		rec, err := decode(value)
		if err != nil {
			// A record that does not decode is shown nowhere (its own
			// turn's stages fail closed on it).
			log.Warn("web: an approval record does not decode", "key", key, "err", err)
			return nil, false
		}
		if rec.Status != schemas.ApprovalPending {
			return nil, false
		}
		return &pendingEntry{rec: rec}, true
	}, log)
	if err != nil {
		return nil, fmt.Errorf("web: %w", err)
	}
	return &pendingIndex{x}, nil
}

// pendingEntry is one pending approval as stored (one revision), with the
// verdicts of the decider rule on it for the people who asked.
type pendingEntry struct {
	rec      *schemas.ApprovalRecord
	verdicts sync.Map // decider key (deciderKey) -> error (nil: may decide)
}

// mayDecide is the verdict of decide (the decider rule, for the person
// key names) on this revision of the record, computed once per person:
// the rule's inputs besides the person (the record, the policy, the keys)
// do not change for one revision in one process.
func (e *pendingEntry) mayDecide(key string, decide func(*schemas.ApprovalRecord) error) error {
	if v, ok := e.verdicts.Load(key); ok {
		err, _ := v.(error)
		return err
	}
	err := decide(e.rec)
	e.verdicts.Store(key, err)
	return err
}

// sync waits until the index holds every write the bucket had when it was
// called (or syncWait passes, or ctx ends: then it reports why, and the
// index answers with what it holds).
func (x *pendingIndex) sync(ctx context.Context) error { return x.Sync(ctx, syncWait) }

// all returns the pending approvals the index holds, in no order. The
// records are shared: callers must not change them.
func (x *pendingIndex) all() []*pendingEntry { return x.All() }
