package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// inLog is turn's batch as its log holds it, failing the test if it has
// none.
func inLog(t *testing.T, ctx context.Context, s *store.Store, turn string) (*schemas.BatchRecord, uint64) {
	t.Helper()
	rec, rev, err := s.Batches.Log.Get(ctx, turn)
	if err != nil {
		t.Fatalf("the batch of %s in its log: %v", turn, err)
	}
	return rec, rev
}

// logEmpty fails the test if turn's log has a batch.
func logEmpty(t *testing.T, ctx context.Context, s *store.Store, turn string) {
	t.Helper()
	if rec, rev, err := s.Batches.Log.Get(ctx, turn); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the log of %s holds %+v @%d (%v); want nothing", turn, rec, rev, err)
	}
}

// inBucket is turn's entry in KV bucket tollgate_batches, as stored,
// failing the test if it has none.
func inBucket(t *testing.T, ctx context.Context, s *store.Store, turn string) jetstream.KeyValueEntry {
	t.Helper()
	e, err := s.Batches.KV.Get(ctx, turn)
	if err != nil {
		t.Fatalf("the batch of %s in %s: %v", turn, s.Batches.KV.Bucket(), err)
	}
	return e
}

// bucketEmpty fails the test if KV bucket tollgate_batches has turn.
func bucketEmpty(t *testing.T, ctx context.Context, s *store.Store, turn string) {
	t.Helper()
	if _, err := s.Batches.KV.Get(ctx, turn); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("%s holds %s (%v); want nothing", s.Batches.KV.Bucket(), turn, err)
	}
}

// putInBucket stores rec's bytes under turn in tollgate_batches as an
// earlier version did (through KV, not through the store), and returns
// the revision.
func putInBucket(t *testing.T, ctx context.Context, s *store.Store, turn string, rec *schemas.BatchRecord) uint64 {
	t.Helper()
	data, err := schemas.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Batches.KV.Create(ctx, turn, data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// A batch created now is kept in its turn's log, with every write after
// it; the bucket never has it.
func TestANewBatchIsKeptInItsLog(t *testing.T) {
	s, ctx := newStore(t)
	id := "t-00000000000000000001"
	rev, err := s.Batches.Create(ctx, id, batch(id, schemas.BatchRunning))
	if err != nil {
		t.Fatal(err)
	}
	if _, lrev := inLog(t, ctx, s, id); lrev != rev {
		t.Fatalf("the log's batch @%d, want the create's @%d", lrev, rev)
	}
	bucketEmpty(t, ctx, s, id)

	got, grev, err := s.Batches.Get(ctx, id)
	if err != nil || grev != rev || got.Bucketed() || got.Legacy() {
		t.Fatalf("Get: %+v @%d, %v; want the log's record @%d, not bucketed", got, grev, err, rev)
	}
	got.State = schemas.BatchAwaiting
	urev, err := s.Batches.Update(ctx, id, got, grev)
	if err != nil {
		t.Fatal(err)
	}
	done, mrev, err := s.Batches.Mutate(ctx, id, func(b *schemas.BatchRecord) error {
		if b.Bucketed() {
			t.Error("Mutate read a bucketed record of a log-kept batch")
		}
		b.State = schemas.BatchCompleted
		return nil
	})
	if err != nil || mrev <= urev || done.State != schemas.BatchCompleted {
		t.Fatalf("Mutate: %+v @%d, %v; want completed after @%d", done, mrev, err, urev)
	}
	if rec, lrev := inLog(t, ctx, s, id); lrev != mrev || rec.State != schemas.BatchCompleted {
		t.Fatalf("the log's batch: %s @%d, want completed @%d", rec.State, lrev, mrev)
	}
	bucketEmpty(t, ctx, s, id)
}

// A batch an earlier version left in the bucket (version 2, or version 1
// without claims) is read from there, marked Bucketed, and every write of
// it goes back there: its turn's log stays empty.
func TestABucketedBatchStaysInTheBucket(t *testing.T) {
	for _, tc := range []struct {
		name   string
		as     func(*schemas.BatchRecord) *schemas.BatchRecord
		legacy bool
	}{
		{"version 2", func(b *schemas.BatchRecord) *schemas.BatchRecord { return b }, false},
		{"version 1", schemas.AsLegacyBatch, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ctx := newStore(t)
			id := "t-00000000000000000002"
			rev := putInBucket(t, ctx, s, id, tc.as(batch(id, schemas.BatchRunning)))

			got, grev, err := s.Batches.Get(ctx, id)
			if err != nil || grev != rev || !got.Bucketed() || got.Legacy() != tc.legacy {
				t.Fatalf("Get: %+v @%d, %v; want the bucket's record @%d, bucketed, legacy %v", got, grev, err, rev, tc.legacy)
			}
			got.State = schemas.BatchAwaiting
			urev, err := s.Batches.Update(ctx, id, got, grev)
			if err != nil {
				t.Fatalf("Update of the bucketed record: %v", err)
			}
			if e := inBucket(t, ctx, s, id); e.Revision() != urev {
				t.Fatalf("the bucket's record @%d, want the update's @%d", e.Revision(), urev)
			}
			_, mrev, err := s.Batches.Mutate(ctx, id, func(b *schemas.BatchRecord) error {
				if !b.Bucketed() || b.Legacy() != tc.legacy {
					t.Errorf("Mutate read %+v: bucketed %v, legacy %v", b, b.Bucketed(), b.Legacy())
				}
				b.State = schemas.BatchStarted
				return nil
			})
			if err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			cur, crev, err := s.Batches.Get(ctx, id)
			if err != nil || crev != mrev {
				t.Fatalf("Get after Mutate: @%d, %v; want @%d", crev, err, mrev)
			}
			_, frev, err := s.Batches.MutateFrom(ctx, id, cur, crev, func(b *schemas.BatchRecord) error {
				b.State = schemas.BatchCompleted
				return nil
			})
			if err != nil {
				t.Fatalf("MutateFrom: %v", err)
			}
			e := inBucket(t, ctx, s, id)
			stored, err := schemas.DecodeBatch(e.Value())
			if err != nil || e.Revision() != frev || stored.State != schemas.BatchCompleted || stored.Legacy() != tc.legacy {
				t.Fatalf("the bucket's record: %+v @%d, %v; want completed @%d, legacy %v (written back as it was read)", stored, e.Revision(), err, frev, tc.legacy)
			}
			logEmpty(t, ctx, s, id)
		})
	}
}

// Create refuses a turn whose batch is in the bucket, even when the
// record there does not decode, and writes nothing to the log; and it
// refuses a record an earlier version would have written (Bucketed) for a
// turn whose batch is in the log, and writes nothing to the bucket.
func TestCreateRefusesATurnWithABatchInTheOtherPlace(t *testing.T) {
	s, ctx := newStore(t)
	t.Run("a batch in the bucket", func(t *testing.T) {
		id := "t-00000000000000000003"
		putInBucket(t, ctx, s, id, batch(id, schemas.BatchAwaiting))
		if _, err := s.Batches.Create(ctx, id, batch(id, schemas.BatchRunning)); !errors.Is(err, store.ErrExists) {
			t.Fatalf("Create over the bucket's batch: %v, want ErrExists", err)
		}
		logEmpty(t, ctx, s, id)
		if got, _, err := s.Batches.Get(ctx, id); err != nil || got.State != schemas.BatchAwaiting {
			t.Fatalf("Get after the refused create: %+v, %v; want the bucket's awaiting batch", got, err)
		}
	})
	t.Run("an undecodable record in the bucket", func(t *testing.T) {
		id := "t-00000000000000000004"
		if _, err := s.Batches.KV.Create(ctx, id, []byte("{json?}")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Batches.Create(ctx, id, batch(id, schemas.BatchRunning)); !errors.Is(err, store.ErrExists) {
			t.Fatalf("Create over an undecodable record: %v, want ErrExists", err)
		}
		logEmpty(t, ctx, s, id)
		if _, _, err := s.Batches.Get(ctx, id); schemas.CodeOf(err) != schemas.CodeMalformed {
			t.Fatalf("Get after the refused create: %v, want the bucket's record, MALFORMED", err)
		}
	})
	t.Run("a batch in the log, created again as an earlier version's", func(t *testing.T) {
		id := "t-00000000000000000005"
		rev, err := s.Batches.Create(ctx, id, batch(id, schemas.BatchRunning))
		if err != nil {
			t.Fatal(err)
		}
		for name, rec := range map[string]*schemas.BatchRecord{
			"version 2": schemas.AsBucketedBatch(batch(id, schemas.BatchQueued)),
			"version 1": schemas.AsLegacyBatch(batch(id, schemas.BatchQueued)),
		} {
			if _, err := s.Batches.Create(ctx, id, rec); !errors.Is(err, store.ErrExists) {
				t.Fatalf("Create of a %s bucketed record over the log's batch: %v, want ErrExists", name, err)
			}
		}
		bucketEmpty(t, ctx, s, id)
		if got, grev, err := s.Batches.Get(ctx, id); err != nil || grev != rev || got.State != schemas.BatchRunning {
			t.Fatalf("Get after the refused creates: %+v @%d, %v; want the log's running @%d", got, grev, err, rev)
		}
	})
}

// A record sent to the wrong place fails its compare-and-set there
// (ErrConflict) and writes nothing; Mutate and MutateFrom then read the
// batch where it is and write it there: a retry, never a second copy.
func TestAMisroutedWriteConflictsAndMutateFindsTheBatch(t *testing.T) {
	s, ctx := newStore(t)
	t.Run("a new record at the bucket's revision", func(t *testing.T) {
		id := "t-00000000000000000006"
		rev := putInBucket(t, ctx, s, id, batch(id, schemas.BatchAwaiting))
		fresh := batch(id, schemas.BatchStarted) // built afresh: not Bucketed
		if _, err := s.Batches.Update(ctx, id, fresh, rev); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("Update of a new record at the bucket's revision: %v, want ErrConflict", err)
		}
		logEmpty(t, ctx, s, id)
		if e := inBucket(t, ctx, s, id); e.Revision() != rev {
			t.Fatalf("the bucket's record @%d after the refused update, want @%d", e.Revision(), rev)
		}

		applied := 0
		got, mrev, err := s.Batches.MutateFrom(ctx, id, fresh, rev, func(b *schemas.BatchRecord) error {
			applied++
			b.State, b.Text = schemas.BatchStarted, "started"
			return nil
		})
		if err != nil || applied != 2 || !got.Bucketed() || got.State != schemas.BatchStarted {
			t.Fatalf("MutateFrom: %+v, %v, applied %d times; want the bucket's record started, applied twice", got, err, applied)
		}
		e := inBucket(t, ctx, s, id)
		stored, err := schemas.DecodeBatch(e.Value())
		if err != nil || e.Revision() != mrev || stored.State != schemas.BatchStarted || stored.Text != "started" {
			t.Fatalf("the bucket's record: %+v @%d, %v; want started @%d", stored, e.Revision(), err, mrev)
		}
		logEmpty(t, ctx, s, id)
	})
	t.Run("a bucketed record at the log's revision", func(t *testing.T) {
		id := "t-00000000000000000007"
		rev, err := s.Batches.Create(ctx, id, batch(id, schemas.BatchAwaiting))
		if err != nil {
			t.Fatal(err)
		}
		stale := schemas.AsBucketedBatch(batch(id, schemas.BatchStarted))
		if _, err := s.Batches.Update(ctx, id, stale, rev); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("Update of a bucketed record at the log's revision: %v, want ErrConflict", err)
		}
		bucketEmpty(t, ctx, s, id)
		got, mrev, err := s.Batches.MutateFrom(ctx, id, stale, rev, func(b *schemas.BatchRecord) error {
			b.State = schemas.BatchStarted
			return nil
		})
		if err != nil || got.Bucketed() || got.State != schemas.BatchStarted {
			t.Fatalf("MutateFrom: %+v, %v; want the log's record started", got, err)
		}
		if rec, lrev := inLog(t, ctx, s, id); lrev != mrev || rec.State != schemas.BatchStarted {
			t.Fatalf("the log's batch: %s @%d, want started @%d", rec.State, lrev, mrev)
		}
		bucketEmpty(t, ctx, s, id)
	})
}

// Get reads the turn's log first: a batch there is the one returned, not
// one the bucket also has.
func TestGetPrefersTheLog(t *testing.T) {
	s, ctx := newStore(t)
	id := "t-00000000000000000008"
	putInBucket(t, ctx, s, id, batch(id, schemas.BatchAwaiting))
	// Only a tool bypassing the router can leave a batch in both places.
	lrev, err := s.Batches.Log.Create(ctx, id, batch(id, schemas.BatchRunning))
	if err != nil {
		t.Fatal(err)
	}
	got, rev, err := s.Batches.Get(ctx, id)
	if err != nil || rev != lrev || got.State != schemas.BatchRunning || got.Bucketed() {
		t.Fatalf("Get: %+v @%d, %v; want the log's running batch @%d, not bucketed", got, rev, err, lrev)
	}
}

// A batch whose record in its log does not decode is reported with its
// code, not looked for in the bucket.
func TestAnUndecodableLogRecordIsNotPassedOver(t *testing.T) {
	s, ctx := newStore(t)
	id := "t-00000000000000000009"
	putInBucket(t, ctx, s, id, batch(id, schemas.BatchAwaiting))
	if _, err := s.Batches.Log.Log.Append(ctx, turnlog.Append{Turn: id, Event: "running", Data: []byte("{json?}")}); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Batches.Get(ctx, id); schemas.CodeOf(err) != schemas.CodeMalformed {
		t.Fatalf("Get: %+v, %v; want the log's record, MALFORMED", got, err)
	}
}

// Ended answers from whichever place keeps the batch, as its state there
// says: for the log, by the last event's name.
func TestEndedReadsTheBatchWhereItIsKept(t *testing.T) {
	s, ctx := newStore(t)
	const inLogID, inBucketID, none = "t-00000000000000000011", "t-00000000000000000012", "t-00000000000000000013"
	rec := batch(inLogID, schemas.BatchRunning)
	rev, err := s.Batches.Create(ctx, inLogID, rec)
	if err != nil {
		t.Fatal(err)
	}
	putInBucket(t, ctx, s, inBucketID, batch(inBucketID, schemas.BatchAwaiting))
	for _, id := range []string{inLogID, inBucketID} {
		if ended, err := s.Batches.Ended(ctx, id); err != nil || ended {
			t.Fatalf("Ended(%s) = %v, %v; want false", id, ended, err)
		}
	}
	if _, err := s.Batches.Ended(ctx, none); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Ended of a turn with no batch: %v, want ErrNotFound", err)
	}

	rec.State = schemas.BatchCompleted
	if _, err := s.Batches.Update(ctx, inLogID, rec, rev); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Batches.Mutate(ctx, inBucketID, func(b *schemas.BatchRecord) error {
		b.State = schemas.BatchFailed
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{inLogID, inBucketID} {
		if ended, err := s.Batches.Ended(ctx, id); err != nil || !ended {
			t.Fatalf("Ended(%s) = %v, %v; want true", id, ended, err)
		}
	}
}

// A batch's end is its log's outcome event, whose record carries the
// turn's outcome; BatchLog.Outcome reads it back, and tells a turn that
// has not ended, one with no events and one an earlier version ended
// (named completed, without an outcome) apart.
func TestTheOutcomeIsReadFromTheEventThatEndedTheBatch(t *testing.T) {
	s, ctx := newStore(t)
	const ended, running, old, none = "t-00000000000000000021", "t-00000000000000000022", "t-00000000000000000023", "t-00000000000000000024"
	rec := batch(ended, schemas.BatchRunning)
	rev, err := s.Batches.Create(ctx, ended, rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Batches.Log.Outcome(ctx, ended); !errors.Is(err, store.ErrNotEnded) {
		t.Fatalf("outcome of a running batch: %v, want ErrNotEnded", err)
	}
	rec.State = schemas.BatchFailed
	rec.Outcome = &schemas.TurnOutcome{V: schemas.TurnOutcomeVersion, TurnID: ended, SessionID: rec.SessionID, State: schemas.TurnFailed, Code: schemas.CodeToolNotFound, FinishedAt: now}
	if _, err := s.Batches.Update(ctx, ended, rec, rev); err != nil {
		t.Fatal(err)
	}
	last, err := s.Batches.Log.Log.Last(ctx, ended)
	if err != nil || last.Name != store.EventOutcome {
		t.Fatalf("the failed batch's last event: %+v, %v; want %q", last, err, store.EventOutcome)
	}
	o, err := s.Batches.Log.Outcome(ctx, ended)
	if err != nil || o.TurnID != ended || o.State != schemas.TurnFailed || o.Code != schemas.CodeToolNotFound || !o.FinishedAt.Equal(now) {
		t.Fatalf("outcome %+v, %v", o, err)
	}
	if done, err := s.Batches.Ended(ctx, ended); err != nil || !done {
		t.Fatalf("Ended after the outcome event: %v, %v", done, err)
	}

	if _, err := s.Batches.Create(ctx, running, batch(running, schemas.BatchRunning)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Batches.Log.Outcome(ctx, running); !errors.Is(err, store.ErrNotEnded) {
		t.Fatalf("outcome of a running batch: %v, want ErrNotEnded", err)
	}
	if _, err := s.Batches.Log.Outcome(ctx, none); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("outcome of a turn with no events: %v, want ErrNotFound", err)
	}
	// An earlier version named the end for its state and only published
	// the outcome.
	data, err := schemas.Encode(batch(old, schemas.BatchCompleted))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Batches.Log.Log.Append(ctx, turnlog.Append{Turn: old, Event: string(schemas.BatchCompleted), Data: data}); err != nil {
		t.Fatal(err)
	}
	if done, err := s.Batches.Ended(ctx, old); err != nil || !done {
		t.Fatalf("Ended of a batch an earlier version ended: %v, %v", done, err)
	}
	if _, err := s.Batches.Log.Outcome(ctx, old); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("outcome of a batch an earlier version ended: %v, want ErrNotFound", err)
	}
}

// A batch placed in its session's order (OrderSeq) is created in its
// turn's log without a read of the bucket: no version that places turns
// keeps batches there. An unplaced one still reads the bucket first. The
// log's compare-and-set still refuses a second placed batch.
func TestAPlacedBatchIsCreatedWithoutReadingTheBucket(t *testing.T) {
	env := jstest.Start(t)
	s, ctx := store.New(env.Buckets), jstest.Ctx(t)
	// Every read of the bucket is a direct get on its stream.
	gets, err := env.NC.SubscribeSync("$JS.API.DIRECT.GET.KV_" + s.Batches.KV.Bucket() + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	placedID, unplacedID := "t-00000000000000000021", "t-00000000000000000022"
	placed := batch(placedID, schemas.BatchRunning)
	placed.OrderSeq, placed.OrderAfter = 7, "t-00000000000000000020"
	rev, err := s.Batches.Create(ctx, placedID, placed)
	if err != nil {
		t.Fatal(err)
	}
	again := batch(placedID, schemas.BatchQueued)
	again.OrderSeq = 7
	if _, err := s.Batches.Create(ctx, placedID, again); !errors.Is(err, store.ErrExists) {
		t.Fatalf("a second placed create: %v, want ErrExists", err)
	}
	if got, _ := inLog(t, ctx, s, placedID); got.State != schemas.BatchRunning || got.OrderSeq != 7 {
		t.Fatalf("the log's batch: %s at %d, want the first create's running at 7 (@%d)", got.State, got.OrderSeq, rev)
	}
	// The later fact: an unplaced create, which reads the bucket once.
	if _, err := s.Batches.Create(ctx, unplacedID, batch(unplacedID, schemas.BatchRunning)); err != nil {
		t.Fatal(err)
	}
	m, err := gets.NextMsg(jstest.Wait)
	if err != nil {
		t.Fatalf("the unplaced create read nothing of the bucket: %v", err)
	}
	if !strings.HasSuffix(m.Subject, "."+unplacedID) {
		t.Fatalf("the first read of the bucket was %s; want the unplaced turn's (the placed creates read nothing)", m.Subject)
	}
	if n, _, _ := gets.Pending(); n != 0 {
		t.Fatalf("%d more reads of the bucket; want the unplaced create's one", n)
	}
}
