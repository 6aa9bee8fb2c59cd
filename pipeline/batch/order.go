package batch

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The session order (docs/protocol.md §1.4, §5.4): when a batch may run.
//
// A batch whose turn came as an entry of its session's order keeps its
// place (BatchRecord.OrderSeq, OrderAfter; Place computes it). Its
// predecessor, OrderAfter, is the turn of the nearest entry before its own
// that places its turn: repeated entries (turnorder.Entry.Repeated) and
// later entries of a turn placed further back are stepped over. This file
// is the rule's one home; the executor and the planner apply it:
//
//   - A batch with a place leaves queued (to running, or to an end) only
//     once its turn has come (ItsTurn): its predecessor's batch is
//     terminal; or it has none (its session's first entry) and the session
//     record, which only earlier versions wrote, names no turn that still
//     holds the session (read unless the records' view, records.go,
//     shows the session without one; otherwise the batch joins that
//     record's queue by Acquire, and the record's release passes the
//     session on to it, as before). End refuses a queued batch whose turn
//     has not come (ErrNotItsTurn). So a terminal batch had its turn, and
//     by induction every batch placed before it is terminal: of a
//     session's placed batches at most one is out of queued and not
//     terminal, and they leave queued in the order of their entries.
//   - A batch whose turn has not come is written queued (its first
//     write), and its predecessor is read again after that write (ItsTurn
//     once more): if it ended meanwhile, the batch starts.
//   - A queued batch whose predecessor has ended is woken (Wake: announced,
//     its notice's message id naming the predecessor) by the redriver's
//     watch of the turn logs (pipeline/redriver, sweep.go), which receives
//     every batch write: when it delivers a predecessor's terminal event
//     it wakes the queued batches it holds placed after it, and when it
//     delivers a batch's queued event it registers the batch under its
//     predecessor first and then reads that predecessor (Wake).
//     Whoever ends a batch reads and announces nothing.
//
// The waiter writes (its queued batch) before it reads (its predecessor),
// and the ender's terminal write reaches the watch after it is stored:
// if the waiter's read did not see the end, the end was stored after the
// queued write. The watch then either holds the queued batch when the
// end is delivered (and wakes it), or receives the queued event after
// the end was stored (its read sees the end): the turn logs' partitions
// deliver in no order among themselves, and the register-then-read on
// the queued event covers either order. So a queued batch whose
// predecessor ended is always started by its own stage or woken by the
// watch. The recovery sweep's pass announces, besides, a queued batch
// whose predecessor has ended (a wake lost with a redriver that died
// after the delivery). No session record is written or read on this
// path, and ending a batch costs no read: a turn's start and end cost no
// request of their own.
//
// (Before session 30, the ender read its session's next entry,
// turnorder.Writer.Next, and announced a queued one. That read was one
// JetStream API request on every turn's end, about a tenth of a fast
// turn's CPU, for a wake that is needed only when a session's turns
// overlap: docs/bench.md, "The ender's read".)

// ErrNotItsTurn is End's refusal to end a queued batch with a place whose
// turn has not come (ItsTurn): it stays queued, and runs or ends when its
// predecessor's end announces it.
var ErrNotItsTurn = errors.New("batch: the batch waits for its turn in its session's order")

// Orders is the engine's reader (and writer) of the sessions' orders, made
// on first use (a stream lookup).
func (e *Engine) Orders(ctx context.Context) (*turnorder.Writer, error) {
	return e.orders.Get(ctx)
}

// Placed is the place an entry gives its turn (Place): the entry's
// sequence and the turn's predecessor. AfterEnded reports that the
// predecessor's batch was read terminal while the place was worked out
// (a later ItsTurn need not read it again).
type Placed struct {
	Seq        uint64
	After      string
	AfterEnded bool
}

// maxStepBack bounds how many entries that place nothing Place steps over
// before it gives up (a transient error: the entry is tried again).
const maxStepBack = 64

// Place is the place that en, an entry of its session's order as
// delivered, gives its turn: none (the zero Placed) for a nil or repeated
// entry; otherwise en's sequence and its predecessor, the turn of the
// nearest entry before en that places its turn. The entry before en
// (en.After at en.AfterSeq) places its turn when that turn's batch has
// that place, or, when the turn has no batch yet, when it is not a
// repeat; otherwise Place steps back over it (reading it for the entry
// before it).
func (e *Engine) Place(ctx context.Context, en *turnorder.Entry) (Placed, error) {
	if en == nil || en.Repeated() {
		return Placed{}, nil
	}
	turn, at := en.After, en.AfterSeq
	for range maxStepBack {
		if at == 0 {
			return Placed{Seq: en.Seq}, nil
		}
		placing, ended, err := e.placing(ctx, turn, at)
		if err != nil {
			return Placed{}, fmt.Errorf("place turn %s: %w", en.Turn, err)
		}
		if placing {
			return Placed{Seq: en.Seq, After: turn, AfterEnded: ended}, nil
		}
		w, err := e.Orders(ctx)
		if err != nil {
			return Placed{}, err
		}
		prev, err := w.At(ctx, at)
		if err != nil {
			return Placed{}, fmt.Errorf("place turn %s: %w", en.Turn, err)
		}
		turn, at = prev.After, prev.AfterSeq
	}
	return Placed{}, fmt.Errorf("place turn %s: more than %d entries that place nothing before it", en.Turn, maxStepBack)
}

// placing reports whether the entry of turn at seq places turn, and
// whether turn's batch was read terminal.
func (e *Engine) placing(ctx context.Context, turn string, seq uint64) (placing, ended bool, err error) {
	if s, ok := e.recent.seq(turn); ok && s != 0 {
		return s == seq, true, nil
	}
	b, _, err := e.cfg.Store.Batches.Get(ctx, turn)
	switch {
	case err == nil:
		return b.OrderSeq == seq, b.State.Terminal(), nil
	case schemas.Permanent(err):
		return true, true, nil // never runs: counted ended (see predecessorEnded)
	case !errors.Is(err, store.ErrNotFound):
		return false, false, err
	}
	w, err := e.Orders(ctx)
	if err != nil {
		return false, false, err
	}
	en, err := w.At(ctx, seq)
	switch {
	case schemas.Permanent(err):
		return false, false, nil // not an entry: it places nothing
	case err != nil:
		return false, false, err
	}
	return !en.Repeated(), false, nil
}

// ItsTurn reports whether the turn of b, a batch with a place, has come
// (see the rule above): its predecessor's batch is terminal (one that
// does not decode counts as ended: it never runs), or b is its session's
// first entry and no turn an earlier version recorded in the session
// record holds the session. In that last case b joins the record's queue
// (Acquire: a write), and its turn has come once the record makes it the
// active turn. A batch without a place has no turn in the order: true.
func (e *Engine) ItsTurn(ctx context.Context, b *schemas.BatchRecord) (bool, error) {
	return e.itsTurn(ctx, b, true)
}

// MayEnd returns ErrNotItsTurn when b is a queued batch with a place
// whose turn has not come (ItsTurn): the one check every writer that ends
// a batch makes first (End here; the planner's end of a loop's record),
// so that a terminal batch always had its turn. Any other batch may end.
func (e *Engine) MayEnd(ctx context.Context, b *schemas.BatchRecord) error {
	if b.State != schemas.BatchQueued || b.OrderSeq == 0 {
		return nil
	}
	its, err := e.ItsTurn(ctx, b)
	switch {
	case err != nil:
		return err
	case !its:
		return ErrNotItsTurn
	}
	return nil
}

// ItsTurnNow is ItsTurn for a batch that is not stored yet: it writes
// nothing, and reports false where ItsTurn would join the session
// record's queue (the batch must exist before it joins).
func (e *Engine) ItsTurnNow(ctx context.Context, b *schemas.BatchRecord) (bool, error) {
	return e.itsTurn(ctx, b, false)
}

func (e *Engine) itsTurn(ctx context.Context, b *schemas.BatchRecord, join bool) (bool, error) {
	switch {
	case b.OrderSeq == 0:
		return true, nil
	case b.OrderAfter != "":
		return e.predecessorEnded(ctx, b.OrderAfter)
	}
	sess := SessionOf(b.Context)
	if e.records.absent(sess.Key) {
		return true, nil // no earlier version's record (records.go): nothing to read
	}
	s, rev, err := e.cfg.Store.Sessions.Get(ctx, sess.Key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("first turn of session %s: %w", sess.Key, err)
	case s.Active == b.TurnID:
		return true, nil // it joined the record's queue and was passed the session
	}
	held := slices.ContainsFunc(s.Queue, func(t string) bool { return t != b.TurnID })
	if !held && s.Active != "" {
		ended, err := e.turnEnded(ctx, s.Active)
		if err != nil {
			return false, fmt.Errorf("first turn of session %s: %w", sess.Key, err)
		}
		held = !ended
	}
	if !held {
		return true, nil
	}
	if !join {
		return false, nil
	}
	var arrival uint64
	if b.Origin == "" && b.Context != nil {
		arrival = b.Context.Provenance.StreamSeq
	}
	return e.Acquire(ctx, sess, b.TurnID, arrival, &SessionSnapshot{Rec: s, Rev: rev})
}

// predecessorEnded reports whether turn's batch is terminal, for the order:
// a batch that does not decode counts as ended (it never runs, and must
// not hold its session's later turns back), one that does not exist yet
// has not.
func (e *Engine) predecessorEnded(ctx context.Context, turn string) (bool, error) {
	return e.batchEnded(ctx, turn, true)
}

// Next is the session's next placing entry after b's (a batch with a
// place), and that turn's batch as read (nil when it has none yet): nil,
// nil, nil when the session has no entry after b's that places another
// turn. It passes over repeated entries, entries of b's own turn, entries
// of turns placed elsewhere, and turns whose batch does not decode (they
// never run: the turn after them is next).
func (e *Engine) Next(ctx context.Context, b *schemas.BatchRecord) (*turnorder.Entry, *schemas.BatchRecord, error) {
	w, err := e.Orders(ctx)
	if err != nil {
		return nil, nil, err
	}
	key := SessionOf(b.Context).Key
	for seq := b.OrderSeq; ; {
		en, err := w.Next(ctx, key, seq)
		switch {
		case errors.Is(err, turnorder.ErrEmpty):
			return nil, nil, nil
		case err != nil:
			return nil, nil, fmt.Errorf("next turn after %s: %w", b.TurnID, err)
		}
		seq = en.Seq
		if en.Turn == b.TurnID || en.Repeated() {
			continue
		}
		nb, _, err := e.cfg.Store.Batches.Get(ctx, en.Turn)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return en, nil, nil
		case schemas.Permanent(err):
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("next turn after %s: %w", b.TurnID, err)
		case nb.OrderSeq != en.Seq:
			continue
		}
		return en, nb, nil
	}
}

// Wake announces turn's batch when it is queued with a place behind a
// predecessor (OrderAfter) whose batch has ended, with the notice's
// message id naming that predecessor (topology.ReadyAfterMsgID: an
// earlier announcement of the turn does not swallow it, and two wakers
// of one end make one notice). It reports whether it announced. A batch
// that is gone or does not decode, one that is not queued, one without a
// predecessor (a session's first entry: ItsTurn's session-record path)
// and one whose predecessor has not ended are left alone. The redriver's
// turn-log watch calls it (see the rule above); its stage's ItsTurn
// decides again when the notice arrives, so a wake is never a start.
func (e *Engine) Wake(ctx context.Context, turn string) (bool, error) {
	b, _, err := e.cfg.Store.Batches.Get(ctx, turn)
	if err != nil {
		return false, ignoreGone(err)
	}
	if b.State != schemas.BatchQueued || b.OrderSeq == 0 || b.OrderAfter == "" {
		return false, nil
	}
	ended, err := e.predecessorEnded(ctx, b.OrderAfter)
	if err != nil || !ended {
		return false, err
	}
	return true, e.announceBatch(ctx, SessionOf(b.Context), b, b.OrderAfter)
}

// maxWalkBack bounds SupersedeBefore's walk.
const maxWalkBack = 64

// SupersedeBefore applies the session policy "supersede" for b, a batch
// with a place that waits for its turn: it walks back from b's
// predecessor through the places (OrderAfter) past the batches that are
// queued too, to the one that holds the session (neither queued nor
// ended), and makes it give way as SupersedeActive does: a batch waiting
// on approvals has them abandoned, an agent loop is marked superseded.
// A running batch, or none (the walk reaches an ended batch, a first
// entry, or a record that is gone), is left to end by itself.
func (e *Engine) SupersedeBefore(ctx context.Context, b *schemas.BatchRecord) error {
	turn := b.OrderAfter
	for range maxWalkBack {
		if turn == "" || e.recent.has(turn) {
			return nil
		}
		old, _, err := e.cfg.Store.Batches.Get(ctx, turn)
		switch {
		case err != nil:
			return ignoreGone(err)
		case old.State.Terminal():
			return nil
		case old.State == schemas.BatchQueued:
			turn = old.OrderAfter
			continue
		case old.Plan:
			return e.SupersedeLoop(ctx, old.TurnID, b.TurnID)
		case old.State != schemas.BatchAwaiting:
			return nil // not waiting on anyone: b runs when it ends
		}
		e.cfg.Logger.Info("turn supersedes its session's waiting batch", "turn", b.TurnID, "superseded", old.TurnID)
		return e.Supersede(ctx, old, b.TurnID)
	}
	return nil
}
