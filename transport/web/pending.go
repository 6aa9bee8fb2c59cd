package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
)

// syncWait bounds how long a page waits for the pending index to catch up
// with the approvals bucket before it is served from what the index holds.
const syncWait = 2 * time.Second

// pendingIndex is the process's projection of the approvals bucket: every
// pending approval, by id, kept in memory and fed by one watch of the
// bucket (its latest value of every key first, then every write as it is
// made). It is built from the bucket's stream when the process starts,
// like every projection, so a restarted process or a second replica
// builds the same index on its own; no page load reads the bucket.
//
// It holds records as stored: who may decide one is not its business (the
// inbox applies policy.Policy.MayDecideApproval to what it shows).
type pendingIndex struct {
	kv     jetstream.KeyValue
	decode func([]byte) (*schemas.ApprovalRecord, error)
	log    *slog.Logger

	mu      sync.Mutex
	recs    map[string]*pendingEntry // pending approvals by id
	applied uint64                   // the bucket stream's sequence the index holds every write up to
	ready   bool                     // the initial values are in
	changed chan struct{}            // closed (and replaced) at every change of applied or ready
	ended   error                    // the watch ended: the index no longer follows the bucket
	stop    func() error
}

// startPendingIndex starts following kv; decode reads a stored value (as
// the store does). The index follows until stop is called or the
// connection closes.
func startPendingIndex(ctx context.Context, kv jetstream.KeyValue, decode func([]byte) (*schemas.ApprovalRecord, error), log *slog.Logger) (*pendingIndex, error) {
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
		return nil, fmt.Errorf("web: watch the approvals: %w", err)
	}
	x := &pendingIndex{kv: kv, decode: decode, log: log, recs: map[string]*pendingEntry{}, changed: make(chan struct{}), stop: w.Stop}
	go x.follow(w.Updates(), last)
	return x, nil
}

// lastSeq is the sequence of the last write the bucket's stream has.
func lastSeq(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("web: approvals bucket status: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, errors.New("web: approvals bucket status has no stream info")
	}
	return bs.StreamInfo().State.LastSeq, nil
}

// follow applies each entry of the watch; nil marks the end of the
// initial values.
func (x *pendingIndex) follow(updates <-chan jetstream.KeyValueEntry, startLast uint64) {
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
	x.ended = errors.New("web: the watch of the approvals bucket ended")
	close(x.changed)
	x.changed = make(chan struct{})
	x.mu.Unlock()
}

func (x *pendingIndex) applyLocked(e jetstream.KeyValueEntry) {
	x.applied = max(x.applied, e.Revision())
	if e.Operation() != jetstream.KeyValuePut {
		delete(x.recs, e.Key())
		return
	}
	rec, err := x.decode(e.Value())
	if err != nil {
		// A record that does not decode is shown nowhere (its own turn's
		// stages fail closed on it).
		x.log.Warn("web: an approval record does not decode", "key", e.Key(), "err", err)
		delete(x.recs, e.Key())
		return
	}
	if rec.Status != schemas.ApprovalPending {
		delete(x.recs, e.Key())
		return
	}
	x.recs[e.Key()] = &pendingEntry{rec: rec}
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
func (x *pendingIndex) sync(ctx context.Context) error {
	want, err := lastSeq(ctx, x.kv)
	if err != nil {
		return err
	}
	wait := time.NewTimer(syncWait)
	defer wait.Stop()
	for {
		x.mu.Lock()
		done, ended, changed := x.ready && x.applied >= want, x.ended, x.changed
		x.mu.Unlock()
		switch {
		case done:
			return nil
		case ended != nil:
			return ended
		}
		select {
		case <-changed:
		case <-wait.C:
			return fmt.Errorf("web: the pending index is behind the approvals bucket (%d of %d)", x.applied, want)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// all returns the pending approvals the index holds, in no order. The
// records are shared: callers must not change them.
func (x *pendingIndex) all() []*pendingEntry {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]*pendingEntry, 0, len(x.recs))
	for _, r := range x.recs {
		out = append(out, r)
	}
	return out
}

// Stop stops following the bucket.
func (x *pendingIndex) Stop() error { return x.stop() }
