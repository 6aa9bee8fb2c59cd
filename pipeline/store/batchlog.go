package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
)

// BatchRecords is where a turn's batch record is kept, by turn id: the
// batches bucket (Store.Batches) or the turn logs (BatchLog). Both keep
// one contract, the one Bucket documents, checked for both by one
// conformance suite (records_test.go):
//
//   - Get returns the record and its revision, ErrNotFound when there is
//     none, or a *schemas.Error when its bytes do not decode;
//   - Create writes a turn's first record, ErrExists when it has one;
//   - Update writes a record at the revision it was read at,
//     ErrConflict when the record has moved on since;
//   - Mutate and MutateFrom apply a change under compare-and-set,
//     reading again on a conflict, ErrSkip writing nothing;
//   - revisions of one turn only grow.
type BatchRecords interface {
	Get(ctx context.Context, turn string) (*schemas.BatchRecord, uint64, error)
	Create(ctx context.Context, turn string, rec *schemas.BatchRecord) (uint64, error)
	Update(ctx context.Context, turn string, rec *schemas.BatchRecord, rev uint64) (uint64, error)
	Mutate(ctx context.Context, turn string, fn func(*schemas.BatchRecord) error) (*schemas.BatchRecord, uint64, error)
	MutateFrom(ctx context.Context, turn string, cur *schemas.BatchRecord, rev uint64, fn func(*schemas.BatchRecord) error) (*schemas.BatchRecord, uint64, error)
}

var (
	_ BatchRecords = Bucket[schemas.BatchRecord, *schemas.BatchRecord]{}
	_ BatchRecords = BatchLog{}
)

// BatchLog keeps batch records as their turn's log (issue 36, design (b):
// the turn's events are the log). Every write is one event of the turn,
// named for the state it leaves the batch in (running, awaiting, started),
// carrying the whole record, so the turn's last event is its batch: Get is
// one read of it, and a revision is that event's stream sequence. The
// write that ends the batch (completed or failed) is the turn's outcome
// event, EventOutcome, whatever the state: its record carries the turn's
// outcome (schemas.BatchRecord.Outcome), and it is the one event of a
// turn that readers of outcomes follow (tollgate.turnlog.*.*.outcome). Create appends the turn's first event; Update appends after
// the event at its revision (turnlog's compare-and-set, which covers the
// one turn).
//
// Each append's message id is "<turn>.<state>.<revision>.<nonce>", the
// nonce 16 random hex digits drawn for the append: its attempts after a
// lost acknowledgement carry the same id, so the writer recognises its own
// stored append (turnlog's read-back), and no other append ever carries
// it. (A digest of the record's bytes would not do: two writers of one
// engine racing to claim the same call under the same clock reading write
// identical bytes, and the loser would take the winner's append for its
// own; TestConcurrentRunsRunACallOnce found it. A stage that makes a
// write again after a crash reads the turn's last event first, so it
// never needs to recognise an append of its former self.)
//
// Unlike the bucket, a turn's log keeps every event until the stream's
// MaxAge: there is no delete, and retention is the stream's.
type BatchLog struct{ Log *turnlog.Log }

// EventOutcome names the event that ends a turn's batch: its last
// (topology.TurnLogOutcomeFilter follows them).
const EventOutcome = topology.EventTurnOutcome

// EventAwaiting names the event that moves a turn's batch to awaiting its
// approvals: its record carries the approvals the move requested
// (topology.TurnLogAwaitingFilter follows them).
const EventAwaiting = topology.EventTurnAwaiting

// EventOf is the name of the event that leaves a batch in state s: the
// state itself, or EventOutcome for a terminal state.
func EventOf(s schemas.BatchState) string {
	if s.Terminal() {
		return EventOutcome
	}
	return string(s)
}

// Terminal reports whether a turn-log event named name ends its batch:
// EventOutcome, or the terminal state's own name, which an earlier
// version wrote.
func Terminal(name string) bool {
	return name == EventOutcome || schemas.BatchState(name).Terminal()
}

// ErrNotEnded is Outcome's error for a turn whose batch has not ended.
var ErrNotEnded = errors.New("store: the batch has not ended")

// Outcome returns the outcome of turn as its log records it: the outcome
// of its ending event (schemas.BatchRecord.Outcome), the one a reader of
// outcomes needs, read without keys. ErrNotFound when the log holds no
// event of turn, or when the event that ended it was written by an
// earlier version (named completed or failed, without an outcome: that
// version only published it); ErrNotEnded when its last event does not
// end the batch; a *schemas.Error when the event does not decode.
func (b BatchLog) Outcome(ctx context.Context, turn string) (*schemas.TurnOutcome, error) {
	ev, err := b.Log.Last(ctx, turn)
	switch {
	case errors.Is(err, turnlog.ErrNoEvents):
		return nil, fmt.Errorf("get the outcome of %s: %w", turn, ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("get the outcome of %s: %w", turn, err)
	case !Terminal(ev.Name):
		return nil, fmt.Errorf("get the outcome of %s: %w (its last event is %s)", turn, ErrNotEnded, ev.Name)
	}
	rec, err := schemas.DecodeBatch(ev.Data)
	switch {
	case err != nil:
		return nil, fmt.Errorf("decode the outcome of %s@%d: %w", turn, ev.Seq, err)
	case rec.Outcome == nil:
		return nil, fmt.Errorf("get the outcome of %s: %w (its batch ended with an event %s that holds none)", turn, ErrNotFound, ev.Name)
	}
	return rec.Outcome, nil
}

// Get returns turn's batch record (its last event) and its revision,
// without the approvals its awaiting event requested
// (schemas.BatchRecord.Requested: that event's, read with
// DecodeRequested).
func (b BatchLog) Get(ctx context.Context, turn string) (*schemas.BatchRecord, uint64, error) {
	ev, err := b.Log.Last(ctx, turn)
	switch {
	case errors.Is(err, turnlog.ErrNoEvents):
		return nil, 0, fmt.Errorf("get the batch of %s: %w", turn, ErrNotFound)
	case err != nil:
		return nil, 0, fmt.Errorf("get the batch of %s: %w", turn, err)
	}
	rec, err := DecodeLogBatch(ev.Data)
	if err != nil {
		return nil, ev.Seq, fmt.Errorf("decode the batch of %s@%d (%s): %w", turn, ev.Seq, ev.Name, err)
	}
	return rec, ev.Seq, nil
}

// DecodeLogBatch is the batch record that a turn-log event's data holds,
// as Get returns it: without the approvals an awaiting event requested
// and the decisions a started event passed on (those are the event's, not
// the batch's state: a write made from this record must not carry them
// again). A *schemas.Error when it does not decode.
func DecodeLogBatch(data []byte) (*schemas.BatchRecord, error) {
	rec, err := schemas.DecodeBatch(data)
	if err != nil {
		return nil, err
	}
	rec.Requested, rec.Decided = nil, nil
	return rec, nil
}

// Create appends turn's first event, rec; ErrExists when turn has one.
func (b BatchLog) Create(ctx context.Context, turn string, rec *schemas.BatchRecord) (uint64, error) {
	seq, err := b.append(ctx, turn, rec, 0)
	if errors.Is(err, turnlog.ErrConflict) {
		return 0, fmt.Errorf("create the batch of %s: %w (%w)", turn, ErrExists, err)
	}
	return seq, err
}

// Update appends rec after the event at rev; ErrConflict when that is
// not turn's last event (or turn has none).
func (b BatchLog) Update(ctx context.Context, turn string, rec *schemas.BatchRecord, rev uint64) (uint64, error) {
	if rev == 0 {
		return 0, fmt.Errorf("update the batch of %s@0: %w (an update names the revision it read)", turn, ErrConflict)
	}
	seq, err := b.append(ctx, turn, rec, rev)
	if errors.Is(err, turnlog.ErrConflict) {
		return 0, fmt.Errorf("update the batch of %s@%d: %w (%w)", turn, rev, ErrConflict, err)
	}
	return seq, err
}

// Mutate is Bucket.Mutate's rule on turn's log.
func (b BatchLog) Mutate(ctx context.Context, turn string, fn func(*schemas.BatchRecord) error) (*schemas.BatchRecord, uint64, error) {
	return mutate(ctx, b.get(turn), b.update(turn), fn)
}

// MutateFrom is Bucket.MutateFrom's rule on turn's log.
func (b BatchLog) MutateFrom(ctx context.Context, turn string, cur *schemas.BatchRecord, rev uint64, fn func(*schemas.BatchRecord) error) (*schemas.BatchRecord, uint64, error) {
	return mutateFrom(ctx, b.get(turn), b.update(turn), cur, rev, fn)
}

func (b BatchLog) get(turn string) func(context.Context) (*schemas.BatchRecord, uint64, error) {
	return func(ctx context.Context) (*schemas.BatchRecord, uint64, error) { return b.Get(ctx, turn) }
}

func (b BatchLog) update(turn string) func(context.Context, *schemas.BatchRecord, uint64) (uint64, error) {
	return func(ctx context.Context, rec *schemas.BatchRecord, rev uint64) (uint64, error) {
		return b.Update(ctx, turn, rec, rev)
	}
}

func (b BatchLog) append(ctx context.Context, turn string, rec *schemas.BatchRecord, after uint64) (uint64, error) {
	if rec.TurnID != turn {
		return 0, schemas.Errorf(schemas.CodeInvalidInput, "the batch of %s is kept under turn %s", rec.TurnID, turn)
	}
	data, err := schemas.Encode(rec)
	if err != nil {
		return 0, err
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return 0, fmt.Errorf("append the batch of %s: draw its message id: %w", turn, err)
	}
	event := EventOf(rec.State)
	return b.Log.Append(ctx, turnlog.Append{Turn: turn, Event: event, After: after, Data: data,
		Header: tracing.Inject(ctx, nil), // the writer's span, when traced: the outcome event continues the turn's trace
		MsgID:  turn + "." + event + "." + strconv.FormatUint(after, 10) + "." + hex.EncodeToString(nonce[:])})
}
