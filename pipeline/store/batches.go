package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Batches keeps the turns' batch records, by turn id, under the
// BatchRecords contract, in two places:
//
//   - a batch created now is kept in its turn's log (BatchLog: each write
//     one event of the turn, the last event the batch);
//   - a batch written before the turn logs (version 1, or version 2 in KV
//     bucket tollgate_batches) stays in the bucket (Bucket) until it ends:
//     read from there it is marked Bucketed (schemas.DecodeBucketedBatch),
//     and every write of it goes back there.
//
// So a turn's batch is in exactly one place for its whole life, and the
// records an earlier version left finish where they are, with their claims
// (docs/protocol.md, "Batch records").
//
// Get reads the turn's log, then, when the log has no event of the turn,
// the bucket: one read for a new turn, two for an earlier version's.
// Create refuses a turn that has a batch in either place (ErrExists), so a
// redelivered accepted turn whose batch an earlier version created in the
// bucket is never given a second one in the log (a turn placed in its
// session's order has none there: Create). Update, Mutate and
// MutateFrom write where the record they write is kept (Bucketed). A record
// sent to the wrong place (one built afresh for a turn whose batch is in
// the bucket) fails its compare-and-set there (ErrConflict: the place has
// no record at that revision), so Mutate reads again and writes to the
// right one: a misrouted write can cost a retry, never make a second copy.
type Batches struct {
	// Bucket is tollgate_batches, with the earlier versions' batches;
	// its Retire and DecodeValue are Batches'.
	Bucket[schemas.BatchRecord, *schemas.BatchRecord]
	// Log is the turn logs, with every batch created since.
	Log BatchLog
}

var _ BatchRecords = Batches{}

// Get returns turn's batch record and its revision (in the place it is
// kept), ErrNotFound when it has none, or a *schemas.Error when its bytes
// do not decode.
func (b Batches) Get(ctx context.Context, turn string) (*schemas.BatchRecord, uint64, error) {
	rec, rev, err := b.Log.Get(ctx, turn)
	if !errors.Is(err, ErrNotFound) {
		return rec, rev, err
	}
	return b.Bucket.Get(ctx, turn)
}

// Ended reports whether turn's batch has ended (completed or failed), or
// ErrNotFound when the turn has none. A batch in its turn's log is read
// by its last event's name (BatchLog: the state the event leaves the
// batch in, EventOutcome for an end), so nothing is decoded: for a stage that asks often (a
// session's holder, at every turn of a session) and needs nothing else. An
// earlier version's batch in the bucket is read and decoded (a
// *schemas.Error when its bytes do not decode).
func (b Batches) Ended(ctx context.Context, turn string) (bool, error) {
	ev, err := b.Log.Log.Last(ctx, turn)
	switch {
	case errors.Is(err, turnlog.ErrNoEvents):
		rec, _, err := b.Bucket.Get(ctx, turn)
		if err != nil {
			return false, err
		}
		return rec.State.Terminal(), nil
	case err != nil:
		return false, fmt.Errorf("get the batch state of %s: %w", turn, err)
	}
	return Terminal(ev.Name), nil
}

// Create writes turn's first batch record: in the bucket when rec is
// Bucketed (a tool writing what an earlier version wrote) once the turn's
// log is found to hold no batch of the turn, else in the turn's log once
// the bucket is found to hold none. ErrExists when the turn has a batch
// in either.
//
// A record with a place in its session's order (OrderSeq) is appended to
// the log without reading the bucket: the turn came as an entry of the
// order, and every version that writes those entries keeps its batches
// in the turn logs (the order came after them), so no version has a batch
// of that turn in the bucket. The log's own compare-and-set still refuses
// a second batch there. That is one read fewer for almost every turn.
func (b Batches) Create(ctx context.Context, turn string, rec *schemas.BatchRecord) (uint64, error) {
	if rec.OrderSeq != 0 && !rec.Bucketed() {
		return b.Log.Create(ctx, turn, rec)
	}
	if rec.Bucketed() {
		// Get reads the log first: a record created in the bucket beside
		// one in the log would never be read.
		switch _, _, err := b.Log.Get(ctx, turn); {
		case err == nil, schemas.CodeOf(err) != "":
			return 0, fmt.Errorf("create the batch of %s in %s: %w (its turn's log has one)", turn, b.Bucket.KV.Bucket(), ErrExists)
		case !errors.Is(err, ErrNotFound):
			return 0, fmt.Errorf("create the batch of %s: %w", turn, err)
		}
		return b.Bucket.Create(ctx, turn, rec)
	}
	switch _, _, err := b.Bucket.Get(ctx, turn); {
	case err == nil, schemas.CodeOf(err) != "":
		return 0, fmt.Errorf("create the batch of %s: %w (an earlier version's record is in %s)", turn, ErrExists, b.Bucket.KV.Bucket())
	case !errors.Is(err, ErrNotFound):
		return 0, fmt.Errorf("create the batch of %s: %w", turn, err)
	}
	return b.Log.Create(ctx, turn, rec)
}

// Update writes rec at rev where rec is kept; ErrConflict when the record
// there has moved on (or is not there).
func (b Batches) Update(ctx context.Context, turn string, rec *schemas.BatchRecord, rev uint64) (uint64, error) {
	if rec.Bucketed() {
		return b.Bucket.Update(ctx, turn, rec, rev)
	}
	return b.Log.Update(ctx, turn, rec, rev)
}

// Mutate is Bucket.Mutate's rule across both places.
func (b Batches) Mutate(ctx context.Context, turn string, fn func(*schemas.BatchRecord) error) (*schemas.BatchRecord, uint64, error) {
	return mutate(ctx, b.get(turn), b.update(turn), fn)
}

// MutateFrom is Bucket.MutateFrom's rule across both places.
func (b Batches) MutateFrom(ctx context.Context, turn string, cur *schemas.BatchRecord, rev uint64, fn func(*schemas.BatchRecord) error) (*schemas.BatchRecord, uint64, error) {
	return mutateFrom(ctx, b.get(turn), b.update(turn), cur, rev, fn)
}

func (b Batches) get(turn string) func(context.Context) (*schemas.BatchRecord, uint64, error) {
	return func(ctx context.Context) (*schemas.BatchRecord, uint64, error) { return b.Get(ctx, turn) }
}

func (b Batches) update(turn string) func(context.Context, *schemas.BatchRecord, uint64) (uint64, error) {
	return func(ctx context.Context, rec *schemas.BatchRecord, rev uint64) (uint64, error) {
		return b.Update(ctx, turn, rec, rev)
	}
}
