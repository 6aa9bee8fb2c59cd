package batch

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
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
// the keys present in tollgate_sessions from a KV watch (keys only), and a
// first entry whose session has no key there, in a view that has caught
// up (every record stored when the watch began delivered) and still
// watches, is decided without the read. Every other first entry reads the
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
	kv    jetstream.KeyValue
	log   *slog.Logger
	gauge prometheus.Gauge // tollgate_session_records_view_current

	mu      sync.Mutex
	users   int
	stop    context.CancelFunc
	done    chan struct{}
	keys    map[string]struct{}
	current bool // the watch caught up and still runs
}

// errRecordsWatchEnded: the watch's updates stopped (the client gave it
// up).
var errRecordsWatchEnded = errors.New("the watch of the session records ended")

// retryRecordsWatch is how long the view waits before it watches again
// after its watch ended (a broker restart, a deleted bucket).
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
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.current {
		return false
	}
	_, ok := v.keys[key]
	return !ok
}

// run watches until ctx ends, watching again after a pause when a watch
// ends; the view is current only while a watch that caught up runs.
func (v *recordView) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	warned := false // logged once per run of failures, not once a second
	for {
		caught, err := v.watch(ctx)
		if ctx.Err() == nil {
			if caught {
				warned = false // it worked since the last warning
			}
			if !warned {
				v.log.Warn("session records' view: the watch ended; first entries read their session record until it is back", "err", err)
				warned = true
			} else {
				v.log.Debug("session records' view: watching again failed", "err", err)
			}
		}
		v.reset()
		select {
		case <-ctx.Done():
			return
		case <-time.After(retryRecordsWatch):
		}
	}
}

func (v *recordView) reset() {
	v.mu.Lock()
	v.current, v.keys = false, nil
	v.mu.Unlock()
	v.gauge.Set(0)
}

// watch follows the bucket's keys until the watch ends or ctx does, and
// reports whether it caught up.
func (v *recordView) watch(ctx context.Context) (caught bool, err error) {
	w, err := v.kv.WatchAll(ctx, jetstream.MetaOnly())
	if err != nil {
		return false, err
	}
	defer w.Stop()
	v.mu.Lock()
	v.keys = map[string]struct{}{}
	v.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return caught, nil
		case e, ok := <-w.Updates():
			if !ok {
				return caught, errRecordsWatchEnded
			}
			v.mu.Lock()
			switch {
			case e == nil: // every record stored when the watch began
				v.current, caught = true, true
				v.gauge.Set(1)
			case e.Operation() == jetstream.KeyValuePut:
				v.keys[e.Key()] = struct{}{}
			default: // a delete or a purge: no record
				delete(v.keys, e.Key())
			}
			v.mu.Unlock()
		}
	}
}
