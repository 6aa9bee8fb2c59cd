package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
// (an empty snapshot: nothing read yet); Acquire leaves in it the session
// record as it last read or wrote it, for ConcludeFrom's release.
func (e *Engine) Acquire(ctx context.Context, sess Session, turnID string, inboundSeq uint64, snap *SessionSnapshot) (bool, error) {
	return e.acquire(ctx, sess, turnID, inboundSeq, snap, true)
}

// AcquireIfFree is Acquire for a turn that has no batch record yet: it
// makes turnID its session's active turn if the session is free (or
// already held by turnID) and reports true, and otherwise writes nothing
// and reports false. A turn joins a session's queue only once its batch
// record exists (the queue's promotion reads it, see Release), so the
// caller of a false answer creates the batch queued and then calls
// Acquire. A true answer leaves turnID holding its session with no batch
// record until the caller creates it: a caller that stops in between
// either comes back (its message is redelivered, AcquireIfFree answers
// true again without writing) or gives up on the turn and releases the
// session (Engine.ReleaseUnrecorded).
func (e *Engine) AcquireIfFree(ctx context.Context, sess Session, turnID string, inboundSeq uint64, snap *SessionSnapshot) (bool, error) {
	return e.acquire(ctx, sess, turnID, inboundSeq, snap, false)
}

func (e *Engine) acquire(ctx context.Context, sess Session, turnID string, inboundSeq uint64, snap *SessionSnapshot, queue bool) (bool, error) {
	key, sessionID := sess.Key, sess.ID
	out := snap
	for {
		cur, rev, err := snap.take()
		snap = nil // a conflict means it is stale: read again
		if cur == nil && err == nil {
			cur, rev, err = e.cfg.Store.Sessions.Get(ctx, key)
		}
		if errors.Is(err, store.ErrNotFound) {
			rec := &schemas.SessionRecord{SessionID: sessionID, Active: turnID, InboundSeq: inboundSeq, UpdatedAt: e.Now()}
			var n uint64
			n, err = e.cfg.Store.Sessions.Create(ctx, key, rec)
			if err == nil {
				out.set(rec, n)
				return true, nil
			}
			if errors.Is(err, store.ErrExists) {
				continue // created meanwhile: read it
			}
		}
		if err != nil {
			return false, fmt.Errorf("acquire session %s: %w", key, err)
		}
		if !queue && cur.Active != "" && cur.Active != turnID {
			out.set(cur, rev)
			return false, nil // busy: the caller creates the batch queued first
		}
		active, write := e.enqueue(cur, turnID, inboundSeq)
		if !write {
			out.set(cur, rev)
			return active, nil
		}
		n, err := e.cfg.Store.Sessions.Update(ctx, key, cur, rev)
		if errors.Is(err, store.ErrConflict) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("acquire session %s: %w", key, err)
		}
		out.set(cur, n)
		return active, nil
	}
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

// set makes s (if not nil) the record rec at revision rev.
func (s *SessionSnapshot) set(rec *schemas.SessionRecord, rev uint64) {
	if s != nil {
		*s = SessionSnapshot{Rec: rec, Rev: rev}
	}
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
	if !b.Plan {
		return e.Announce(ctx, sess, b.TurnID)
	}
	n := &schemas.TurnNotice{TurnID: b.TurnID, SessionID: sess.ID, Kind: schemas.NoticeReady, At: e.Now()}
	return bus.Publish(ctx, e.cfg.JS, topology.PlanReadySubject(sess.Key), topology.PlanReadyMsgID(b.TurnID), n)
}

// Release ends turnID's hold on its session: the next queued turn becomes
// active and is announced on the ready subject. If turnID no longer holds the
// session (a repeated Release), the currently active turn is announced again
// if it is still queued, so a crash between the two steps loses nothing.
// Release with turnID "" is the recovery sweep's: it promotes the first
// queued turn of a session that has none active, or re-announces the
// active one, and changes nothing otherwise.
func (e *Engine) Release(ctx context.Context, sess Session, turnID string) error {
	return e.release(ctx, sess, turnID, nil)
}

// ReleaseUnrecorded releases sess if turnID holds it and has no batch
// record: a turn given up on (its accepted message dead-lettered) between
// AcquireIfFree and the creation of its batch must not hold its session
// for good, and no sweep finds a session whose turn has no record. It
// does nothing when turnID has a batch record (ending that batch releases
// the session) or does not hold the session.
func (e *Engine) ReleaseUnrecorded(ctx context.Context, sess Session, turnID string) error {
	_, _, err := e.cfg.Store.Batches.Get(ctx, turnID)
	switch {
	case err == nil || schemas.Permanent(err):
		return nil
	case !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("release the session of %s: load its batch: %w", turnID, err)
	}
	s, rev, err := e.cfg.Store.Sessions.Get(ctx, sess.Key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("release session %s: %w", sess.Key, err)
	case s.Active != turnID:
		return nil
	}
	return e.release(ctx, sess, turnID, &SessionSnapshot{Rec: s, Rev: rev})
}

// release is Release, starting from snap (if it holds the record) instead
// of a first read.
func (e *Engine) release(ctx context.Context, sess Session, turnID string, snap *SessionSnapshot) error {
	key, sessionID := sess.Key, sess.ID
	for {
		var cur *schemas.SessionRecord
		var rev uint64
		// Only a snapshot in which turnID holds the session: the function
		// below skips (writes nothing, checks nothing) when it does not,
		// and a stale snapshot must only ever cost a conflict.
		if snap != nil && snap.Rec != nil && snap.Rec.SessionID == sessionID && snap.Rec.Active == turnID && turnID != "" {
			cur, rev = snap.Rec, snap.Rev
		}
		snap = nil
		promoted := false // next (below) came from the queue by this write
		s, _, err := e.cfg.Store.Sessions.MutateFrom(ctx, key, cur, rev, func(s *schemas.SessionRecord) error {
			promoted = false
			if s.Active != turnID || (s.Active == "" && len(s.Queue) == 0) {
				return store.ErrSkip
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
			// (AcquireIfFree) and its executor is about to create its
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
			turnID = next // it ended while queued: pass the session on
			continue
		case nb.State == schemas.BatchQueued:
			return e.AnnounceBatch(ctx, sess, nb)
		default:
			return nil // already running
		}
	}
}
