package approver

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/schemas"
)

// PendingTracker watches the approvals bucket. It keeps the gauge of
// pending approvals and, when given an expire function, calls it for each
// pending approval once its expiry passes, so approvals expire even when
// nobody answers and no decision ever arrives.
//
// It reads the bucket itself (a KV watch, which starts with every current
// record), so it reflects every writer, and after a restart it finds the
// approvals that expired while no approver was running and expires them at
// once. Several approvers may track the same bucket: the expiry is a
// compare-and-set, so exactly one wins.
type PendingTracker struct {
	kv     jetstream.KeyValue
	decode func([]byte) (*schemas.ApprovalRecord, error)
	log    *slog.Logger
	gauge  prometheus.Gauge
	// overdue is how many approvals are past their expiry and still not
	// expired (their expiry failed and is being retried): an approver that
	// cannot expire them leaves their batches waiting.
	overdue prometheus.Gauge
	expire  func(ctx context.Context, id string) error // nil: gauge only
	now     func() time.Time

	pending map[string]time.Time // pending approval id -> expiry (zero: none)
	due     dueHeap
	// retry holds the approvals whose expiry failed part-way (for example
	// stored as expired, then the decided event could not be published):
	// they are tried again even after the watch reports them decided, or
	// their batch would wait for an announcement that never comes.
	retry map[string]time.Time

	// watching is set while Run's watch runs and has delivered every
	// record present when it started (Watching).
	watching atomic.Bool

	// latest is the last revision the watch delivered of pending
	// approvals, decoded, at most maxLatest of them (Latest).
	latestMu sync.Mutex
	latest   map[string]revision
}

// revision is a pending approval record as the watch delivered it,
// decoded once (apply), and its revision. rec is never modified: Latest
// hands out copies of it.
type revision struct {
	rec *schemas.ApprovalRecord
	rev uint64
}

// maxLatest bounds the pending revisions the tracker keeps for Latest
// (about 2 KiB each, decoded): past it, an arbitrary one is dropped, and a
// decision on it reads the bucket as before.
const maxLatest = 4096

// Latest returns the last revision of pending approval id that the watch
// delivered (the record as decoded when it was delivered, and its
// revision), if the tracker keeps one. It may be stale: the record may
// have changed since, and the watch not delivered that yet. The approver
// decides a write on it only by compare-and-set at that revision, which a
// stale one fails (Approver.apply).
//
// The record is a copy of its top-level fields; what they point to (the
// context, the options, the votes, the preview) is shared with the
// tracker and every other caller, and must not be modified (Authorize
// builds its next record without writing them).
func (p *PendingTracker) Latest(id string) (*schemas.ApprovalRecord, uint64, bool) {
	p.latestMu.Lock()
	r, ok := p.latest[id]
	p.latestMu.Unlock()
	if !ok {
		return nil, 0, false
	}
	rec := *r.rec
	return &rec, r.rev, true
}

// keep records the revision of key the watch delivered: a pending one
// (rec not nil) is kept, any other drops the key.
func (p *PendingTracker) keep(key string, rec *schemas.ApprovalRecord, rev uint64) {
	p.latestMu.Lock()
	defer p.latestMu.Unlock()
	if rec == nil {
		delete(p.latest, key)
		return
	}
	if _, ok := p.latest[key]; !ok && len(p.latest) >= maxLatest {
		for k := range p.latest {
			delete(p.latest, k)
			break
		}
	}
	p.latest[key] = revision{rec: rec, rev: rev}
}

// Watching is nil while Run's watch of the approvals bucket runs and has
// caught up with the records present when it started; otherwise it says
// that the tracker is not watching (not started, catching up, or between
// a watch that ended and its restart).
func (p *PendingTracker) Watching() error {
	if !p.watching.Load() {
		return errors.New("pending-approvals tracker: not watching the approvals bucket")
	}
	return nil
}

// Watching is the pending-approvals tracker's (PendingTracker.Watching):
// the approver's expiry runs only while it is nil.
func (a *Approver) Watching() error { return a.pending.Watching() }

// NewPendingTracker registers tollgate_approvals_pending and
// tollgate_approvals_overdue with reg (if not
// nil; see metrics.Register). decode reads a stored record (nil:
// schemas.Decode); expire, if not nil, is called for each pending approval
// whose expiry has passed.
func NewPendingTracker(kv jetstream.KeyValue, decode func([]byte) (*schemas.ApprovalRecord, error), expire func(context.Context, string) error, now func() time.Time, log *slog.Logger, reg prometheus.Registerer) (*PendingTracker, error) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tollgate_approvals_pending", Help: "Approval records currently in status pending.",
	})
	if err := metrics.Register(reg, &g); err != nil {
		return nil, err
	}
	overdue := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tollgate_approvals_overdue", Help: "Approvals past their expiry whose expiry failed and is being retried.",
	})
	if err := metrics.Register(reg, &overdue); err != nil {
		return nil, err
	}
	if decode == nil {
		decode = func(b []byte) (*schemas.ApprovalRecord, error) { return schemas.Decode[schemas.ApprovalRecord](b) }
	}
	if now == nil {
		now = time.Now
	}
	return &PendingTracker{kv: kv, decode: decode, log: log, gauge: g, overdue: overdue, expire: expire, now: now, pending: map[string]time.Time{}, retry: map[string]time.Time{}, latest: map[string]revision{}}, nil
}

// expiryRetry is how long a failed expiry waits before it is tried again.
const expiryRetry = 2 * time.Second

// Run watches until ctx is cancelled. Records that do not decode are counted
// as not pending and logged.
func (p *PendingTracker) Run(ctx context.Context) error {
	w, err := p.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch approvals: %w", err)
	}
	defer w.Stop()
	defer p.watching.Store(false)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.arm(timer)
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil { // initial values delivered
				p.watching.Store(true)
				continue
			}
			p.apply(e)
		case <-timer.C:
			p.fire(ctx)
		}
	}
}

// arm sets timer to the earliest expiry, dropping stale heap entries.
func (p *PendingTracker) arm(timer *time.Timer) {
	for p.due.Len() > 0 {
		top := p.due[0]
		if at, ok := p.pending[top.id]; ok && at.Equal(top.at) {
			break
		}
		if at, ok := p.retry[top.id]; ok && at.Equal(top.at) {
			break
		}
		heap.Pop(&p.due)
	}
	if p.due.Len() == 0 {
		timer.Reset(time.Hour)
		return
	}
	timer.Reset(max(p.due[0].at.Sub(p.now()), 0))
}

// fire expires every approval that is due. A failure is retried later; an
// approval that was decided meanwhile leaves the map through the watch.
func (p *PendingTracker) fire(ctx context.Context) {
	now := p.now()
	defer func() { p.overdue.Set(float64(len(p.retry))) }()
	for p.due.Len() > 0 && !p.due[0].at.After(now) {
		d := heap.Pop(&p.due).(dueEntry)
		at, pending := p.pending[d.id]
		again, retrying := p.retry[d.id]
		if !(pending && at.Equal(d.at)) && !(retrying && again.Equal(d.at)) {
			continue
		}
		if p.expire == nil {
			continue
		}
		if err := p.expire(ctx, d.id); err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Warn("approval expiry failed; will retry", "approval", d.id, "err", err)
			next := now.Add(expiryRetry)
			p.retry[d.id] = next
			if pending {
				p.pending[d.id] = next
			}
			heap.Push(&p.due, dueEntry{at: next, id: d.id})
			continue
		}
		delete(p.retry, d.id)
	}
}

func (p *PendingTracker) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	var pending *schemas.ApprovalRecord
	if e.Operation() == jetstream.KeyValuePut {
		rec, err := p.decode(e.Value())
		switch {
		case err != nil:
			p.log.Warn("pending tracker: undecodable approval record", "key", key, "err", err)
		case rec.Status == schemas.ApprovalPending:
			pending = rec
		}
	}
	p.keep(key, pending, e.Revision())
	if pending != nil {
		expires := pending.ExpiresAt
		if old, ok := p.pending[key]; !ok || !old.Equal(expires) {
			p.pending[key] = expires
			if !expires.IsZero() {
				heap.Push(&p.due, dueEntry{at: expires, id: key})
			}
		}
	} else {
		delete(p.pending, key)
	}
	p.gauge.Set(float64(len(p.pending)))
}

type dueEntry struct {
	at time.Time
	id string
}

// dueHeap is a min-heap of expiries (container/heap).
type dueHeap []dueEntry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueEntry)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
