package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Session names the session a turn belongs to: its id (as the transport
// gave it, kept in the session record) and its key (schemas.SessionKeyOf
// of the turn's sealed TurnContext), under which its record and its ready
// notices live.
type Session struct {
	ID, Key string
}

// SessionOf is the session of the turn whose sealed context is tc.
func SessionOf(tc *schemas.TurnContext) Session {
	if tc == nil {
		return Session{}
	}
	return Session{ID: tc.SessionID, Key: schemas.SessionKeyOf(tc)}
}

// Acquire makes turnID the active turn of its session if the session is
// free, or queues it behind the active one (once). It reports whether
// turnID is now active. inboundSeq, if not zero, is the turn's inbound
// stream sequence: the session's arrival watermark (SessionRecord.InboundSeq)
// is raised to it in the same compare-and-set. The caller has checked that
// every earlier inbound message of the session is settled (package
// sessionorder), so queue order is arrival order. snap, if not nil, is the
// session record as the caller just read it, used instead of a first read
// (an empty snapshot: nothing read yet).
//
// An active turn whose batch has ended no longer holds the session
// (Release writes nothing when no turn is queued): Acquire takes such a
// session as free. When turns are queued behind an ended turn, Acquire
// passes the session on to the queue's head (as the ended turn's Release
// would have) before it queues turnID.
func (e *Engine) Acquire(ctx context.Context, sess Session, turnID string, inboundSeq uint64, snap *SessionSnapshot) (bool, error) {
	return e.acquire(ctx, sess, turnID, inboundSeq, snap, true)
}

// acquireIfFree is Acquire for a turn that has no batch record yet: it
// makes turnID its session's active turn if the session is free (or
// already held by turnID) and reports true, and otherwise writes nothing
// and reports false. Earlier versions' executors took a free session so
// before creating the batch; this version never does (a turn with a place
// runs by its session's order, order.go), and tests use it (export_test.go)
// to leave what those versions left: a session held by a turn with no
// batch record, which its redelivery or ReleaseUnrecorded resolves.
func (e *Engine) acquireIfFree(ctx context.Context, sess Session, turnID string, inboundSeq uint64, snap *SessionSnapshot) (bool, error) {
	return e.acquire(ctx, sess, turnID, inboundSeq, snap, false)
}

func (e *Engine) acquire(ctx context.Context, sess Session, turnID string, inboundSeq uint64, snap *SessionSnapshot, queue bool) (bool, error) {
	key, sessionID := sess.Key, sess.ID
	for {
		cur, rev, err := snap.take()
		snap = nil // a conflict means it is stale: read again
		if cur == nil && err == nil {
			cur, rev, err = e.cfg.Store.Sessions.Get(ctx, key)
		}
		if errors.Is(err, store.ErrNotFound) {
			rec := &schemas.SessionRecord{SessionID: sessionID, Active: turnID, InboundSeq: inboundSeq, UpdatedAt: e.Now()}
			_, err = e.cfg.Store.Sessions.Create(ctx, key, rec)
			if err == nil {
				return true, nil
			}
			if errors.Is(err, store.ErrExists) {
				continue // created meanwhile: read it
			}
		}
		if err != nil {
			return false, fmt.Errorf("acquire session %s: %w", key, err)
		}
		// An active turn that has ended released the session with its
		// terminal write (see Release): with no turn queued the session is
		// free; with turns queued, its release was cut short (or raced
		// this turn's joining the queue) and the queue's head goes next.
		holder, holderEnded := "", false
		if cur.Active != "" && cur.Active != turnID {
			holder = cur.Active
			if holderEnded, err = e.turnEnded(ctx, holder); err != nil {
				return false, fmt.Errorf("acquire session %s: %w", key, err)
			}
			if holderEnded && len(cur.Queue) == 0 {
				cur.Active, holder = "", ""
			}
		}
		if !queue && cur.Active != "" && cur.Active != turnID {
			return false, e.passOn(ctx, sess, holder, holderEnded)
		}
		active, write := e.enqueue(cur, turnID, inboundSeq)
		if !write {
			if active {
				return true, nil
			}
			return false, e.passOn(ctx, sess, holder, holderEnded)
		}
		if f := e.beforeQueue.Load(); f != nil && !active {
			(*f)(turnID)
		}
		_, err = e.cfg.Store.Sessions.Update(ctx, key, cur, rev)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("acquire session %s: %w", key, err)
		}
		if active {
			return true, nil
		}
		if !holderEnded {
			// The holder may have ended since it was read, and its release
			// read the session before this turn joined the queue, found no
			// one to pass it to and wrote nothing: look again, now that
			// the queue holds this turn. One of the two sees the other.
			if holderEnded, err = e.turnEnded(ctx, holder); err != nil {
				return false, fmt.Errorf("acquire session %s: %w", key, err)
			}
		}
		return false, e.passOn(ctx, sess, holder, holderEnded)
	}
}

// passOn completes the release of holder, an active turn found ended with
// turns queued behind it (when ended is true): the queue's head is
// promoted and announced. Nothing otherwise.
func (e *Engine) passOn(ctx context.Context, sess Session, holder string, ended bool) error {
	if !ended || holder == "" {
		return nil
	}
	return e.release(ctx, sess, holder, false)
}

// turnEnded reports whether turn's batch record is terminal. A turn with no
// record has not ended: it took its free session and its record is about
// to be created (an earlier version's acquireIfFree), and if it is given up on its session is
// released (ReleaseUnrecorded). A record that does not decode has not
// ended either: its stages fail closed on it and end it with the code.
func (e *Engine) turnEnded(ctx context.Context, turn string) (bool, error) {
	return e.batchEnded(ctx, turn, false)
}

// batchEnded reports whether turn's batch is terminal: true when this
// engine ended it lately (an ended batch stays ended), false when it has
// no record, undecodable for a record that does not decode.
func (e *Engine) batchEnded(ctx context.Context, turn string, undecodable bool) (bool, error) {
	if e.recent.has(turn) {
		return true, nil
	}
	ended, err := e.cfg.Store.Batches.Ended(ctx, turn)
	switch {
	case err == nil:
		return ended, nil
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case schemas.Permanent(err):
		return undecodable, nil
	}
	return false, fmt.Errorf("load the batch of turn %s: %w", turn, err)
}

// SessionSnapshot is a session record as its caller just read it, handed
// to Acquire so that it does not read it again: Rec at revision Rev, or
// NotFound when the key did not exist. A stale snapshot costs one
// compare-and-set conflict and a fresh read.
type SessionSnapshot struct {
	Rec      *schemas.SessionRecord
	Rev      uint64
	NotFound bool
}

// take returns the snapshot as Acquire's first read: the record, or
// store.ErrNotFound, or nothing (nil, 0, nil) for a nil snapshot.
func (s *SessionSnapshot) take() (*schemas.SessionRecord, uint64, error) {
	switch {
	case s == nil:
		return nil, 0, nil
	case s.NotFound:
		return nil, 0, store.ErrNotFound
	}
	return s.Rec, s.Rev, nil
}

// enqueue applies Acquire's change to session record s: turnID becomes
// active if the session is free, or joins the queue once; the arrival
// watermark rises to inboundSeq. It reports whether turnID is active and
// whether s changed (must be written).
func (e *Engine) enqueue(s *schemas.SessionRecord, turnID string, inboundSeq uint64) (active, write bool) {
	raise := inboundSeq > s.InboundSeq
	if raise {
		s.InboundSeq = inboundSeq
	}
	write = true
	switch {
	case s.Active == turnID:
		active, write = true, raise
	case s.Active == "":
		active = true
		s.Active = turnID
		s.Queue = slices.DeleteFunc(s.Queue, func(t string) bool { return t == turnID })
	case slices.Contains(s.Queue, turnID):
		write = raise
	default:
		s.Queue = append(s.Queue, turnID)
	}
	if write {
		s.UpdatedAt = e.Now()
	}
	return active, write
}

// Announce publishes the ready notice of turnID (message id
// topology.ReadyMsgID), on which an executor advances its batch: a queued
// turn that is now its session's active one, or (from the recovery sweep) a
// running batch whose executor died. It is for batches the executor runs;
// AnnounceBatch picks the stage from the record.
func (e *Engine) Announce(ctx context.Context, sess Session, turnID string) error {
	n := &schemas.TurnNotice{TurnID: turnID, SessionID: sess.ID, Kind: schemas.NoticeReady, At: e.Now()}
	return bus.Publish(ctx, e.cfg.JS, topology.ReadySubject(sess.Key), topology.ReadyMsgID(turnID), n)
}

// AnnounceBatch announces that queued batch b may start now that its
// session sess is free: the planner's loop-ready notice (topology.PlanReadySubject,
// message id topology.PlanReadyMsgID) for a planner turn's record
// (BatchRecord.Plan), the executor's ready notice (Announce) otherwise.
func (e *Engine) AnnounceBatch(ctx context.Context, sess Session, b *schemas.BatchRecord) error {
	return e.announceBatch(ctx, sess, b, "")
}

// announceBatch is AnnounceBatch; after, if not "", is the turn whose end
// announces b (its predecessor in its session's order), named in the
// notice's message id (topology.ReadyAfterMsgID).
func (e *Engine) announceBatch(ctx context.Context, sess Session, b *schemas.BatchRecord, after string) error {
	n := &schemas.TurnNotice{TurnID: b.TurnID, SessionID: sess.ID, Kind: schemas.NoticeReady, At: e.Now()}
	subj, id := topology.ReadySubject(sess.Key), topology.ReadyMsgID(b.TurnID)
	if b.Plan {
		subj, id = topology.PlanReadySubject(sess.Key), topology.PlanReadyMsgID(b.TurnID)
	}
	if after != "" {
		id = topology.ReadyAfterMsgID(b.TurnID, after)
		if b.Plan {
			id = topology.PlanReadyAfterMsgID(b.TurnID, after)
		}
	}
	return bus.Publish(ctx, e.cfg.JS, subj, id, n)
}

// Release ends turnID's hold on its session, if it has ended: the next
// queued turn becomes active and is announced on the ready subject. With
// no turn queued, Release writes nothing: the session record keeps naming
// turnID, and the terminal batch record is the release (Acquire takes a
// session whose active turn has ended as free, and the recovery sweep
// retires it once it has been idle a while: RetireSession). Release reads
// the session record (never a copy the caller holds): a turn that joined
// the queue after that read sees turnID ended when it looks again
// (Acquire), so one of the two passes the session on.
//
// If turnID no longer holds the session (a repeated Release), the
// currently active turn is announced again if it is still queued, so a
// crash between the two steps loses nothing. Release with turnID "" is the
// recovery sweep's: it promotes the first queued turn of a session that
// has none active, or whose active turn has ended, or re-announces the
// active one, and changes nothing otherwise.
func (e *Engine) Release(ctx context.Context, sess Session, turnID string) error {
	return e.release(ctx, sess, turnID, false)
}

// RetireSession frees sess if its active turn has ended and no turn is
// queued, by a write that ends the session record (Active cleared; with a
// store that keeps records for a retention period, the write carries the
// TTL, store.Store.Retain). This is the write a turn's release skips
// (Release): the recovery sweep makes it for a session idle for a while,
// so an idle session's record leaves the bucket, and a session busy with
// one turn after another writes nothing between them. With turns queued
// behind an ended turn, it passes the session on, as Release does. It
// reports whether the session is idle now (no active turn, none queued);
// false with a nil error means a turn still holds it.
func (e *Engine) RetireSession(ctx context.Context, sess Session) (bool, error) {
	s, _, err := e.cfg.Store.Sessions.Get(ctx, sess.Key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("retire session %s: %w", sess.Key, err)
	case s.Active == "" && len(s.Queue) == 0:
		return true, nil
	case s.Active != "":
		if ended, err := e.turnEnded(ctx, s.Active); err != nil || !ended {
			return false, err
		}
	}
	// Active is "" (turns queued: release promotes the first) or ended.
	if err := e.release(ctx, sess, s.Active, true); err != nil {
		return false, err
	}
	return len(s.Queue) == 0, nil
}

// ReleaseUnrecorded releases sess if turnID holds it and has no batch
// record: a turn given up on (its accepted message dead-lettered) between
// an earlier version's acquireIfFree and the creation of its batch must not hold its session
// for good, and no sweep finds a session whose turn has no record. It
// does nothing when turnID has a batch record (ending that batch releases
// the session); when turnID does not hold the session it changes nothing
// and, as a repeated Release does, announces the active turn again if it
// is still queued. Unlike Release it writes
// even with no turn queued: a turn without a record never ends, so its
// hold must be cleared.
func (e *Engine) ReleaseUnrecorded(ctx context.Context, sess Session, turnID string) error {
	_, _, err := e.cfg.Store.Batches.Get(ctx, turnID)
	switch {
	case err == nil || schemas.Permanent(err):
		return nil
	case !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("release the session of %s: load its batch: %w", turnID, err)
	}
	return e.release(ctx, sess, turnID, true)
}

// release is Release; free makes it clear the session (a write) when no
// turn is queued, where Release leaves the ended turn named.
func (e *Engine) release(ctx context.Context, sess Session, turnID string, free bool) error {
	key := sess.Key
	for {
		promoted := false // next (below) came from the queue by this write
		s, _, err := e.cfg.Store.Sessions.Mutate(ctx, key, func(s *schemas.SessionRecord) error {
			promoted = false
			if s.Active != turnID || (s.Active == "" && len(s.Queue) == 0) {
				return store.ErrSkip
			}
			if len(s.Queue) == 0 && !free {
				return store.ErrSkip // the terminal batch is the release
			}
			s.Active = ""
			if len(s.Queue) > 0 {
				s.Active, s.Queue, promoted = s.Queue[0], s.Queue[1:], true
			}
			s.UpdatedAt = e.Now()
			return nil
		})
		if errors.Is(err, store.ErrNotFound) {
			return nil // the turn never held the session
		}
		if err != nil {
			return fmt.Errorf("release session %s: %w", key, err)
		}
		next := s.Active
		if next == "" || next == turnID {
			return nil
		}
		nb, _, err := e.cfg.Store.Batches.Get(ctx, next)
		switch {
		case errors.Is(err, store.ErrNotFound) && !promoted:
			// The session's active turn, which this release did not
			// promote, has no record yet: it took its free session
			// (an earlier version's acquireIfFree) and its executor is about to create its
			// batch, or will release it if it gives up on the turn
			// (ReleaseUnrecorded). It holds the session: leave it.
			return nil
		case errors.Is(err, store.ErrNotFound):
			// A queued turn always has its record before it joins the
			// queue (Acquire); a promoted turn without one was removed:
			// skip it.
			turnID = next
			continue
		}
		if err != nil {
			return fmt.Errorf("release session %s: load next %s: %w", key, next, err)
		}
		switch {
		case nb.State.Terminal():
			turnID = next // it ended (while queued, or lazily released): pass the session on
			continue
		case nb.State == schemas.BatchQueued:
			return e.AnnounceBatch(ctx, sess, nb)
		default:
			return nil // already running
		}
	}
}

// recentEnded is how many of the turns it ended lately an Engine
// remembers (endedTurns): about a minute of turns at 100 turns/s, far more
// than the sessions it runs at once.
const recentEnded = 8192

// endedTurns is a bounded set of turn ids, each with its batch's place
// (OrderSeq, 0 for none), the oldest forgotten first.
type endedTurns struct {
	mu   sync.Mutex
	set  map[string]uint64
	ring []string
	next int
}

func newEndedTurns(n int) endedTurns {
	return endedTurns{set: make(map[string]uint64, n), ring: make([]string, n)}
}

func (t *endedTurns) add(turn string, seq uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.set[turn]; ok {
		return
	}
	if old := t.ring[t.next]; old != "" {
		delete(t.set, old)
	}
	t.ring[t.next] = turn
	t.set[turn] = seq
	t.next = (t.next + 1) % len(t.ring)
}

func (t *endedTurns) has(turn string) bool {
	_, ok := t.seq(turn)
	return ok
}

// seq is the place of turn's batch, if the set holds turn.
func (t *endedTurns) seq(turn string) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.set[turn]
	return s, ok
}
