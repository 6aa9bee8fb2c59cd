package redriver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Recovery sweep.
//
// Every step of a turn is driven by a message that is acknowledged only
// after its work is done, so a worker that dies mid-step leaves its message
// to be redelivered to a peer. What that cannot cover is work whose driving
// message was never published: a stage that changed a record and died (or
// lost the broker) before publishing the event that announces the change.
// Examples: an approval expired or abandoned by compare-and-set whose
// decided event was lost, so its batch waits forever; a session released in
// KV whose ready notice was lost, so the next turn stays queued; a batch
// whose consumer message was dead-lettered or purged.
//
// The sweep closes those gaps from the stored batches. It follows the turn
// logs' last events (turnlog.Watch) and the batches bucket, which keeps an
// earlier version's batches (a KV watch): both start with every current
// record, so a restarted redriver sees everything its dead peers left. It
// keeps the non-terminal batches. Every SweepInterval it looks at each batch not updated for
// SweepAfter, with a per-batch back-off (doubling up to maxSweepBackoff) so
// that batches legitimately waiting days for a person cost little:
//
//   - awaiting, and every approval is decided: Redrive (the barrier,
//     idempotent: one compare-and-set starts it);
//   - started: Redrive, which resumes it (execution claims keep each call at
//     most once; a call whose claim has no result is reported
//     needs_attention after the claim lease, never run blindly);
//   - queued, with a place in its session's order: announced if the batch
//     before it has ended (the ender's announcement was lost) or it is
//     its session's first entry; its stage starts it (batch.Engine.ItsTurn);
//   - queued, without a place (an earlier version's): Engine.Release(session,
//     ""), which promotes or re-announces the session's active turn if its
//     release was lost; a queued batch in no session queue at all is
//     announced, so that its stage takes the session for it;
//   - running, for longer than the claim lease: a ready notice for the
//     turn, so an executor resumes it.
//
// It also follows the sessions bucket (a KV watch), for the write a turn's
// release skips: a turn that ends with no turn queued behind it leaves its
// session record naming it (batch.Engine.Release: the terminal batch is
// the release). A session record that names an active turn or a queue and
// has not been written for SweepAfter is looked at, with the same
// back-off: if its active turn has ended, batch.Engine.RetireSession
// clears it (a write carrying the retention TTL, so the idle record leaves
// the bucket) or passes it on to a turn queued behind. A session busy with
// one turn after another is written by each turn's acquire and never
// comes due. Action "retire".
//
// A planner turn's record (BatchRecord.Plan) is swept only while queued:
// a running loop is driven by the planner's own messages, and its step
// batches are swept as batches of their own.
//
// The same watch wakes the turns queued in their sessions' orders
// (batch.Engine.Wake, the rule in pipeline/batch/order.go): it keeps each
// queued batch with a place under its predecessor; when it delivers a
// batch's terminal write it wakes the batches kept under it, and when it
// delivers a queued write it keeps the batch and then has its predecessor
// read (the partitions of the turn logs deliver in no order among
// themselves: the end may have come first). Wakes run on a few workers
// beside the watch (wakeWorkers) from a bounded queue (maxWakes): one
// that does not fit is left to the pass, which announces a queued batch
// whose predecessor has ended. The watch runs even where the passes are
// off (Config.SweepInterval negative): it is how queued turns start.
// Action "wake", a normal start, not a recovery.
//
// Several redrivers may sweep the same bucket; every action is idempotent.
// Actions are counted in tollgate_sweep_actions_total{action}, as are looks
// at a batch that rightly waits for a person (action "waiting").

const (
	// DefaultSweepInterval is how often the sweep looks.
	DefaultSweepInterval = 15 * time.Second
	// DefaultSweepAfter is how long a batch must be untouched before the
	// sweep acts on it: long enough that the normal path has certainly had
	// its chance.
	DefaultSweepAfter = time.Minute
	// maxSweepBackoff caps the per-batch back-off between looks.
	maxSweepBackoff = 30 * time.Minute
	// maxSweepLooks caps the batches one pass looks at (the longest-due
	// first); the rest wait for the next pass. A restarted redriver with
	// 100,000 batches waiting for people then spreads its reads over
	// minutes instead of issuing them all at once.
	maxSweepLooks = 2000

	actionWaiting = "waiting"
	actionRetire  = "retire"
	actionWake    = "wake"

	// wakeWorkers is how many wakes run at once; maxWakes bounds the
	// wakes waiting for a worker (past it, the pass finds the batch).
	wakeWorkers = 4
	maxWakes    = 4096

	// sessionKey prefixes a session's key among the sweep's entries,
	// which are otherwise keyed by turn id (a space is in neither).
	sessionKey = "session "
)

// sweepEntry is what the sweep knows of one non-terminal batch, or of one
// session that is not idle (session set).
type sweepEntry struct {
	session *batch.Session
	state   schemas.BatchState
	updated time.Time
	next    time.Time     // earliest next look
	backoff time.Duration // current back-off
	after   string        // a queued batch's predecessor in its session's order (kept in waiters)
}

type sweeper struct {
	r       *Redriver
	every   time.Duration
	after   time.Duration
	actions *prometheus.CounterVec

	mu   sync.Mutex
	open map[string]*sweepEntry
	// waiters are the queued batches with a place, by predecessor: the
	// turns a predecessor's end wakes.
	waiters map[string]map[string]struct{}

	wakes   chan string // turns to wake (Engine.Wake), for the wake workers
	noWakes atomic.Bool // tests: the watch wakes nothing (the pass's fallback)

	maxLooks  atomic.Int64 // per pass; maxSweepLooks (tests lower it)
	mostLooks atomic.Int64 // the most batches one pass looked at (tests)

	// watching is set while run's watch runs and has delivered every
	// batch present when it started (Sweeping).
	watching atomic.Bool

	// awaiting is the last event of turns whose batch awaits its
	// approvals, as the turn-log watch delivered it, at most maxAwaiting
	// of them (awaitingEvent).
	awaitingMu sync.Mutex
	awaiting   map[string]turnlog.Event
}

// maxAwaiting bounds the awaiting events the sweep keeps for the redrive
// of a decision (about 2 KiB each): past it, an arbitrary one is
// dropped, and a decision on its batch reads the turn's log as before.
const maxAwaiting = 4096

// awaitingEvent is the last event of turn's log that the watch delivered,
// when that event moved the batch to awaiting and the sweep keeps it. It
// may be stale (a later event not delivered yet): the redriver acts on it
// only by a compare-and-set at its sequence (Redriver.redrive).
func (s *sweeper) awaitingEvent(turn string) (turnlog.Event, bool) {
	s.awaitingMu.Lock()
	defer s.awaitingMu.Unlock()
	ev, ok := s.awaiting[turn]
	return ev, ok
}

// keepAwaiting records ev, the last event of its turn that the watch
// delivered: an awaiting event is kept, any other drops the turn's.
func (s *sweeper) keepAwaiting(ev *turnlog.Event) {
	s.awaitingMu.Lock()
	defer s.awaitingMu.Unlock()
	if ev.Name != store.EventAwaiting {
		delete(s.awaiting, ev.Turn)
		return
	}
	if _, ok := s.awaiting[ev.Turn]; !ok && len(s.awaiting) >= maxAwaiting {
		for k := range s.awaiting {
			delete(s.awaiting, k)
			break
		}
	}
	s.awaiting[ev.Turn] = turnlog.Event{Turn: ev.Turn, Name: ev.Name, Seq: ev.Seq, Data: ev.Data}
}

// Sweeping is nil while the recovery sweep runs: its watches of the turn
// logs and the batches and sessions buckets run and have caught up with
// the records present when they started.
// Otherwise it says that the sweep is not running (not started, catching
// up, or between a watch that ended and its restart). The watches run,
// and wake queued turns, even with the passes off (Config.SweepInterval
// negative).
func (r *Redriver) Sweeping() error {
	if r.sweep.watching.Load() {
		return nil
	}
	return errors.New("recovery sweep: not watching the turn logs and the batches and sessions buckets")
}

func newSweeper(r *Redriver) *sweeper {
	s := &sweeper{
		r: r, every: r.cfg.SweepInterval, after: r.cfg.SweepAfter, open: map[string]*sweepEntry{}, awaiting: map[string]turnlog.Event{},
		waiters: map[string]map[string]struct{}{}, wakes: make(chan string, maxWakes),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_sweep_actions_total",
			Help: "Recovery-sweep actions on batches whose driving message was lost (redrive, release, announce), idle sessions retired (retire), and failed attempts (error).",
		}, []string{"action"}),
	}
	s.maxLooks.Store(maxSweepLooks)
	return s
}

// run watches the batches bucket and sweeps until ctx is cancelled. The
// passes run beside the watch, one at a time, so that a long pass never
// stops the watch from being read (unread watch messages pile up in the
// client's buffer, and past its limit the watch has to start over); so do
// the wakes. With SweepInterval negative it watches and wakes, and makes
// no passes.
func (s *sweeper) run(ctx context.Context) error {
	w, err := s.r.cfg.Store.Batches.KV.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("sweep: watch batches: %w", err)
	}
	defer w.Stop()
	lw, err := s.r.cfg.Store.Batches.Log.Log.Watch(ctx)
	if err != nil {
		return fmt.Errorf("sweep: watch the turn logs: %w", err)
	}
	defer lw.Stop()
	sw, err := s.r.cfg.Store.Sessions.KV.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("sweep: watch sessions: %w", err)
	}
	defer sw.Stop()
	defer s.watching.Store(false)
	var ticks <-chan time.Time
	if s.every >= 0 {
		tick := time.NewTicker(max(s.every, time.Millisecond))
		defer tick.Stop()
		ticks = tick.C
	}
	var passes sync.WaitGroup
	defer passes.Wait()
	wctx, stopWakes := context.WithCancel(ctx)
	defer stopWakes() // before passes.Wait: the wake workers are counted there
	for range wakeWorkers {
		passes.Add(1)
		go func() {
			defer passes.Done()
			s.wakeLoop(wctx)
		}()
	}
	busy := make(chan struct{}, 1)
	bucketDone, logsDone, sessionsDone := false, false, false
	caughtUp := func() { s.watching.Store(bucketDone && logsDone && sessionsDone) }
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("sweep: the watch of the batches bucket ended")
			}
			if e == nil { // every current batch delivered
				bucketDone = true
				caughtUp()
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				s.forget(e.Key())
				continue
			}
			s.apply(e.Key(), e.Value())
		case ev, ok := <-lw.Updates():
			if !ok {
				return errors.New("sweep: the watch of the turn logs ended")
			}
			if ev == nil {
				logsDone = true
				caughtUp()
				continue
			}
			s.keepAwaiting(ev)
			if store.Terminal(ev.Name) {
				// The batch ended (its event's name says so): nothing to
				// sweep, and nothing to decode; the turns queued after it
				// are woken.
				s.ended(ev.Turn)
				continue
			}
			s.apply(ev.Turn, ev.Data)
		case e, ok := <-sw.Updates():
			if !ok {
				return errors.New("sweep: the watch of the sessions bucket ended")
			}
			if e == nil {
				sessionsDone = true
				caughtUp()
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				s.forget(sessionKey + e.Key())
				continue
			}
			s.applySession(e.Key(), e.Value())
		case <-ticks:
			select {
			case busy <- struct{}{}:
			default:
				continue // the last pass is still going
			}
			passes.Add(1)
			go func() {
				defer passes.Done()
				defer func() { <-busy }()
				s.sweep(ctx)
			}()
		}
	}
}

// forget drops turn: its record was deleted.
func (s *sweeper) forget(turn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(turn)
}

// ended drops turn, whose batch ended, and wakes the batches queued after
// it.
func (s *sweeper) ended(turn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endedLocked(turn)
}

func (s *sweeper) endedLocked(turn string) {
	s.dropLocked(turn)
	for w := range s.waiters[turn] {
		s.queueWake(w)
	}
}

// dropLocked drops turn's entry and its place among its predecessor's
// waiters.
func (s *sweeper) dropLocked(turn string) {
	if e := s.open[turn]; e != nil && e.after != "" {
		s.unwaitLocked(e.after, turn)
	}
	delete(s.open, turn)
}

func (s *sweeper) unwaitLocked(after, turn string) {
	if ws := s.waiters[after]; ws != nil {
		delete(ws, turn)
		if len(ws) == 0 {
			delete(s.waiters, after)
		}
	}
}

// queueWake hands turn to the wake workers, or leaves it to the pass when
// maxWakes wakes already wait.
func (s *sweeper) queueWake(turn string) {
	if s.noWakes.Load() {
		return
	}
	select {
	case s.wakes <- turn:
	default:
		s.r.cfg.Logger.Debug("sweep: wake queue full; the pass will find the queued turn", "turn", turn)
	}
}

// wakeLoop wakes the turns queueWake hands it until ctx ends.
func (s *sweeper) wakeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case turn := <-s.wakes:
			woke, err := s.r.cfg.Engine.Wake(ctx, turn)
			switch {
			case err != nil && ctx.Err() == nil:
				s.actions.WithLabelValues("error").Inc()
				s.r.cfg.Logger.Warn("sweep: waking a queued turn failed; the pass will look again", "turn", turn, "err", err)
			case woke:
				s.actions.WithLabelValues(actionWake).Inc()
				s.r.cfg.Logger.Debug("sweep: woke a queued turn whose predecessor ended", "turn", turn)
			}
		}
	}
}

// apply records one write of turn's batch record, as stored. A turn's
// writes reach it in the order they were made (one key of the bucket, or
// one turn's log, which is in one partition), so the last applied is the
// batch.
//
// A queued batch with a place is kept under its predecessor (waiters) and
// then woken, once per predecessor it is kept under: the predecessor may
// have ended before this write was delivered (Engine.Wake reads it).
func (s *sweeper) apply(turn string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b batchHead
	if err := msgpack.Unmarshal(data, &b); err != nil || (b.V != schemas.BatchVersion && b.V != schemas.BatchLegacyVersion) {
		// An undecodable record is never acted on by guesswork; the stage
		// that reads it dead-letters its message with the code.
		s.dropLocked(turn)
		return
	}
	if b.State.Terminal() {
		s.endedLocked(turn)
		return
	}
	if b.Plan && b.State != schemas.BatchQueued {
		// A running agent loop waits on its model and its step batches (each
		// swept as a batch of its own); the planner's own messages drive it.
		s.dropLocked(turn)
		return
	}
	e := &sweepEntry{state: b.State, updated: b.UpdatedAt, next: b.UpdatedAt.Add(s.after)}
	if b.State == schemas.BatchQueued && b.OrderSeq != 0 {
		e.after = b.OrderAfter
	}
	old := s.open[turn]
	s.open[turn] = e
	switch {
	case old != nil && old.after == e.after:
		return // kept already (or never)
	case old != nil && old.after != "":
		s.unwaitLocked(old.after, turn)
	}
	if e.after == "" {
		return
	}
	ws := s.waiters[e.after]
	if ws == nil {
		ws = map[string]struct{}{}
		s.waiters[e.after] = ws
	}
	ws[turn] = struct{}{}
	s.queueWake(turn)
}

// applySession records one write of the session record at key: a
// session that is idle (no active turn, none queued) is dropped, any other
// comes due SweepAfter after the write.
func (s *sweeper) applySession(key string, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := schemas.Decode[schemas.SessionRecord](data)
	if err != nil || (rec.Active == "" && len(rec.Queue) == 0) {
		// An undecodable record is never acted on: the stages that read it
		// fail closed with the code.
		delete(s.open, sessionKey+key)
		return
	}
	s.open[sessionKey+key] = &sweepEntry{session: &batch.Session{ID: rec.SessionID, Key: key},
		updated: rec.UpdatedAt, next: rec.UpdatedAt.Add(s.after)}
}

// batchHead is the part of a batch record the sweep tracks. Every batch
// write reaches the watch, so it decodes only these fields and skips the
// context and the calls; before it acts, the sweep reads the whole record
// through the store, which decodes and validates it.
type batchHead struct {
	V          schemas.Version    `msgpack:"v"`
	State      schemas.BatchState `msgpack:"state"`
	UpdatedAt  time.Time          `msgpack:"updated_at"`
	Plan       bool               `msgpack:"plan"`
	OrderSeq   uint64             `msgpack:"order_seq"`
	OrderAfter string             `msgpack:"order_after"`
}

// sweep acts on every due entry.
func (s *sweeper) sweep(ctx context.Context) {
	now := s.r.cfg.Engine.Now()
	type due struct {
		turn string
		e    sweepEntry
	}
	var work []due
	s.mu.Lock()
	for turn, e := range s.open {
		if !now.Before(e.next) {
			work = append(work, due{turn, *e})
		}
	}
	// The longest-due first, at most maxSweepLooks of them; the others stay
	// due for the next pass.
	slices.SortFunc(work, func(a, b due) int { return a.e.next.Compare(b.e.next) })
	work = work[:min(len(work), int(s.maxLooks.Load()))]
	if n := int64(len(work)); n > s.mostLooks.Load() {
		s.mostLooks.Store(n) // one pass at a time: no race between passes
	}
	for _, d := range work {
		e := s.open[d.turn]
		e.backoff = min(max(2*e.backoff, s.after), maxSweepBackoff)
		e.next = now.Add(e.backoff)
	}
	s.mu.Unlock()
	for _, d := range work {
		if ctx.Err() != nil {
			return
		}
		action, err := s.act(ctx, d.turn, d.e, now)
		switch {
		case err != nil:
			s.actions.WithLabelValues("error").Inc()
			s.r.cfg.Logger.Warn("sweep: recovery action failed; will look again", "turn", d.turn, "state", d.e.state, "err", err)
		case action == actionWaiting:
			s.actions.WithLabelValues(action).Inc()
		case action == actionRetire:
			// The normal end of an idle session, not a recovery.
			s.actions.WithLabelValues(action).Inc()
			s.r.cfg.Logger.Debug("sweep: retired an idle session", "session", d.e.session.Key, "untouched", now.Sub(d.e.updated).Round(time.Second))
		case action != "":
			s.actions.WithLabelValues(action).Inc()
			s.r.cfg.Logger.Info("sweep: recovered a batch whose driving message was lost", "turn", d.turn, "state", d.e.state, "action", action,
				"untouched", now.Sub(d.e.updated).Round(time.Second))
		}
	}
}

// act performs the recovery action for one batch, if it needs one, and
// names it.
func (s *sweeper) act(ctx context.Context, turn string, e sweepEntry, now time.Time) (string, error) {
	r := s.r
	if e.session != nil {
		idle, err := r.cfg.Engine.RetireSession(ctx, *e.session)
		if err != nil || !idle {
			return "", err // held by a turn that has not ended, or passed on
		}
		return actionRetire, nil
	}
	switch e.state {
	case schemas.BatchAwaiting:
		b, _, err := r.cfg.Store.Batches.Get(ctx, turn)
		if err != nil {
			return "", err
		}
		if b.State != schemas.BatchAwaiting {
			return "", nil // moved on; the watch will tell
		}
		if v, err := Evaluate(ctx, r.cfg.Engine.Keys(), b, r.approval); err == nil && v.Kind == schemas.RedriveDeferred {
			return actionWaiting, nil // a safe wait for a person
		}
		// All decided, or the approvals are bad: Redrive decides (and
		// fails the batch with the code in the second case).
		return "redrive", r.Redrive(ctx, turn, "sweep")
	case schemas.BatchStarted:
		return "redrive", r.Redrive(ctx, turn, "sweep")
	case schemas.BatchQueued:
		b, _, err := r.cfg.Store.Batches.Get(ctx, turn)
		if err != nil {
			return "", err
		}
		sess := batch.SessionOf(b.Context)
		if b.OrderSeq != 0 {
			// A batch with a place waits for the batch before it in its
			// session's order; if that one has ended (its wake lost), or
			// it is its session's first entry, it is announced and its
			// stage starts it (batch.Engine.ItsTurn decides).
			its := b.OrderAfter == ""
			if !its {
				if its, err = r.cfg.Engine.ItsTurnNow(ctx, b); err != nil {
					return "", err
				}
			}
			if !its {
				return "", nil
			}
			return "announce", r.cfg.Engine.AnnounceBatch(ctx, sess, b)
		}
		if err := r.cfg.Engine.Release(ctx, sess, ""); err != nil {
			return "", err
		}
		s, _, err := r.cfg.Store.Sessions.Get(ctx, sess.Key)
		switch {
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return "release", err
		case err == nil && (s.Active == turn || slices.Contains(s.Queue, turn)):
			return "release", nil
		}
		// In no session queue: its stage never took the session for it
		// (or the record was rebuilt without it). Announced, its stage
		// takes the session again (Acquire), which queues it if it is
		// busy.
		return "announce", r.cfg.Engine.AnnounceBatch(ctx, sess, b)
	case schemas.BatchRunning:
		if now.Sub(e.updated) < r.cfg.Engine.ClaimLease() {
			return "", nil
		}
		b, _, err := r.cfg.Store.Batches.Get(ctx, turn)
		if err != nil {
			return "", err
		}
		return "announce", r.cfg.Engine.Announce(ctx, batch.SessionOf(b.Context), turn)
	}
	return "", nil
}
