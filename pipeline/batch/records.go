package batch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/pipeline/store"
)

// The session records' view: which sessions have a record of an earlier
// version (docs/protocol.md §1.4, "The session record of earlier
// versions"), known without a read.
//
// A session's first entry runs at once unless its session record names a
// turn that still holds the session (ItsTurn). Only earlier versions'
// turns make such records, so in a deployment whose upgrade is over the
// bucket is empty and the read finds nothing, on every new session's
// first turn. A stage that follows the view (Engine.FollowRecords) keeps
// the keys present in tollgate_sessions in a store.Index (one KV watch),
// and a first entry whose session has no key there, in a view that has
// caught up (every record stored when the watch began delivered) and
// still watches, is decided without the read. Every other first entry reads the
// record as before: one with a key, and every one while the view is not
// current (before it caught up, after its watch ended and until a new one
// caught up, in a process that does not follow it).
//
// What it gives up: a record written after the first entry's check is
// not seen. That is so with the read too (a record written after the
// read), and only an earlier version's turn makes a record for a session
// with none (its own stage during a rolling upgrade, or this version's
// Acquire for its batch without a place; a first entry joins a record
// only when one holds the session already); the view moves the check's
// moment back by the watch's delivery delay, the time from a write's
// acknowledgement to its delivery to the watch. A key stays in the view
// until the watch delivers its deletion; a record that expired by its
// TTL without a delete marker stays (it is then read, and found gone), so
// the view errs towards the read.
type recordView struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu    sync.Mutex
	users int
	stop  context.CancelFunc
	done  chan struct{}
	keys  *store.Index[struct{}] // the bucket's keys; nil while none is followed
}

// retryRecordsWatch is how long the view waits before it watches again
// after its watch ended (a broker restart, a deleted bucket) or could not
// start.
const retryRecordsWatch = time.Second

// FollowRecords keeps e's view of the session records (see recordView)
// until the returned function is called: the stages that run first
// entries (executor, planner) call it for as long as they run. Calls may
// overlap; one watch serves them all and stops after the last one's
// release.
func (e *Engine) FollowRecords() (release func()) {
	v := e.records
	v.mu.Lock()
	defer v.mu.Unlock()
	v.users++
	if v.users == 1 {
		ctx, stop := context.WithCancel(context.Background())
		v.stop, v.done = stop, make(chan struct{})
		go v.run(ctx, v.done)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			v.mu.Lock()
			v.users--
			var done chan struct{}
			if v.users == 0 {
				v.stop()
				done = v.done
			}
			v.mu.Unlock()
			if done != nil {
				<-done
			}
		})
	}
}

// absent reports whether the view is current and has no record of key:
// then the session has no record of an earlier version to read.
func (v *recordView) absent(key string) bool {
	x := v.index()
	return x != nil && x.Current() && !x.Has(key)
}

// current is the gauge tollgate_session_records_view_current.
func (v *recordView) current() float64 {
	if x := v.index(); x != nil && x.Current() {
		return 1
	}
	return 0
}

func (v *recordView) index() *store.Index[struct{}] {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.keys
}

// run follows the bucket's keys (a store.Index holding every key) until
// ctx ends, following again after a pause when the index's watch ends or
// cannot start.
func (v *recordView) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	for failing := false; ; { // failing: warned already, for this run of failures
		x, err := store.NewIndex(ctx, v.kv, "the session records", func(string, []byte) (struct{}, bool) { return struct{}{}, true }, v.log)
		if err == nil {
			failing = false
			v.set(x)
			select {
			case <-ctx.Done():
			case <-x.Done():
				err = errors.New("the watch of the session records ended")
			}
			v.set(nil)
			_ = x.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		if failing {
			v.log.Debug("session records' view: following again failed", "err", err)
		} else {
			v.log.Warn("session records' view: not following the bucket; first entries read their session record until it is back", "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryRecordsWatch):
		}
	}
}

func (v *recordView) set(x *store.Index[struct{}]) {
	v.mu.Lock()
	v.keys = x
	v.mu.Unlock()
}
