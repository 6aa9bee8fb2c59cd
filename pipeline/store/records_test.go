package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// batchStores are the kinds of store.BatchRecords, each on a fresh server:
// the one conformance suite below runs on every one.
var batchStores = []struct {
	name string
	open func(t *testing.T) store.BatchRecords
}{
	{"the batches bucket", func(t *testing.T) store.BatchRecords {
		s, _ := newStore(t)
		return s.Batches.Bucket
	}},
	{"the turn logs", func(t *testing.T) store.BatchRecords {
		env := jstest.Start(t)
		return store.BatchLog{Log: turnlog.Bind(env.JS, env.Buckets.TurnLogs)}
	}},
	{"the batches router", func(t *testing.T) store.BatchRecords {
		s, ctx := newStore(t)
		// Every batch it writes is a new one: kept in the log, never in KV.
		t.Cleanup(func() { nothingIn(t, ctx, "the batches bucket", bucketGet(s)) })
		return s.Batches
	}},
	{"the batches router, on records an earlier version left in the bucket", func(t *testing.T) store.BatchRecords {
		s, ctx := newStore(t)
		// Every batch it writes is an earlier version's: kept in KV,
		// never in the log.
		t.Cleanup(func() { nothingIn(t, ctx, "the turn logs", s.Batches.Log.Get) })
		return earlierVersion{s.Batches}
	}},
}

// bucketGet reads the batches bucket of s, as stored (not through Batches).
func bucketGet(s *store.Store) func(context.Context, string) (*schemas.BatchRecord, uint64, error) {
	return s.Batches.Bucket.Get
}

// nothingIn fails the test if get finds a batch of the turns the
// conformance suite writes.
func nothingIn(t *testing.T, ctx context.Context, where string, get func(context.Context, string) (*schemas.BatchRecord, uint64, error)) {
	t.Helper()
	for _, turn := range []string{"t-1", "t-2", "t-none"} {
		if rec, rev, err := get(ctx, turn); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s holds a batch of %s: %+v @%d, %v; want none", where, turn, rec, rev, err)
		}
	}
}

// earlierVersion is the batches router writing every record it creates
// or updates as one an earlier version kept in the bucket (Bucketed): the
// router's reads and retries then have to keep to the bucket. (Its Mutate
// and MutateFrom are the router's, on the records it reads.)
type earlierVersion struct{ store.Batches }

func (e earlierVersion) Create(ctx context.Context, turn string, rec *schemas.BatchRecord) (uint64, error) {
	return e.Batches.Create(ctx, turn, schemas.AsBucketedBatch(rec))
}

func (e earlierVersion) Update(ctx context.Context, turn string, rec *schemas.BatchRecord, rev uint64) (uint64, error) {
	return e.Batches.Update(ctx, turn, schemas.AsBucketedBatch(rec), rev)
}

// TestBatchRecordsConformance: every kind of BatchRecords keeps the
// contract BatchRecords documents.
func TestBatchRecordsConformance(t *testing.T) {
	for _, kind := range batchStores {
		t.Run(kind.name, func(t *testing.T) {
			t.Run("a record is read back as written, with its revision", func(t *testing.T) {
				b := kind.open(t)
				ctx := jstest.Ctx(t)
				if _, _, err := b.Get(ctx, "t-none"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("Get of a turn without a batch: %v, want ErrNotFound", err)
				}
				want := batch("t-1", schemas.BatchRunning)
				rev, err := b.Create(ctx, "t-1", want)
				if err != nil || rev == 0 {
					t.Fatalf("create: %d, %v", rev, err)
				}
				got, grev, err := b.Get(ctx, "t-1")
				if err != nil || grev != rev || !sameRecord(t, got, want) {
					t.Fatalf("get: %+v @%d, %v; want %+v @%d", got, grev, err, want, rev)
				}
			})
			t.Run("a second create is refused", func(t *testing.T) {
				b := kind.open(t)
				ctx := jstest.Ctx(t)
				rev, err := b.Create(ctx, "t-1", batch("t-1", schemas.BatchRunning))
				if err != nil {
					t.Fatal(err)
				}
				other := batch("t-1", schemas.BatchQueued)
				if _, err := b.Create(ctx, "t-1", other); !errors.Is(err, store.ErrExists) {
					t.Fatalf("second create: %v, want ErrExists", err)
				}
				if got, grev, _ := b.Get(ctx, "t-1"); grev != rev || got.State != schemas.BatchRunning {
					t.Fatalf("after a refused create: %s @%d, want running @%d", got.State, grev, rev)
				}
			})
			t.Run("an update at a stale revision is refused", func(t *testing.T) {
				b := kind.open(t)
				ctx := jstest.Ctx(t)
				rev, err := b.Create(ctx, "t-1", batch("t-1", schemas.BatchRunning))
				if err != nil {
					t.Fatal(err)
				}
				rev2, err := b.Update(ctx, "t-1", batch("t-1", schemas.BatchAwaiting), rev)
				if err != nil || rev2 <= rev {
					t.Fatalf("update at the current revision: %d, %v; want a later revision than %d", rev2, err, rev)
				}
				if _, err := b.Update(ctx, "t-1", batch("t-1", schemas.BatchCompleted), rev); !errors.Is(err, store.ErrConflict) {
					t.Fatalf("update at a stale revision: %v, want ErrConflict", err)
				}
				if _, err := b.Update(ctx, "t-2", batch("t-2", schemas.BatchCompleted), rev); !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("update of a turn without a batch: %v, want a conflict", err)
				}
				if got, grev, _ := b.Get(ctx, "t-1"); grev != rev2 || got.State != schemas.BatchAwaiting {
					t.Fatalf("after a refused update: %s @%d, want awaiting @%d", got.State, grev, rev2)
				}
			})
			t.Run("mutations under contention are all applied, one write each", func(t *testing.T) {
				b := kind.open(t)
				ctx := jstest.Ctx(t)
				rev0, err := b.Create(ctx, "t-1", batch("t-1", schemas.BatchRunning))
				if err != nil {
					t.Fatal(err)
				}
				const n = 8
				var firstRead sync.WaitGroup
				firstRead.Add(n)
				var wg sync.WaitGroup
				errs := make(chan error, n)
				var revs sync.Map
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						first := true
						_, rev, err := b.Mutate(ctx, "t-1", func(r *schemas.BatchRecord) error {
							if first {
								first = false
								firstRead.Done()
								firstRead.Wait() // all start from one revision: n-1 must read again
							}
							r.Calls = append(r.Calls, schemas.ToolCall{CallID: schemas.CallID("t-1", i+1), Tool: "echo", Args: `{}`, ArgsDigest: schemas.ArgsDigest(`{}`)})
							r.Approvals, r.Results = append(r.Approvals, ""), append(r.Results, nil)
							return nil
						})
						if err != nil {
							errs <- err
						}
						revs.Store(rev, true)
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("mutate: %v", err)
				}
				got, rev, err := b.Get(ctx, "t-1")
				if err != nil {
					t.Fatal(err)
				}
				seen := map[string]bool{}
				for _, c := range got.Calls {
					if seen[c.CallID] {
						t.Fatalf("call %s added twice", c.CallID)
					}
					seen[c.CallID] = true
				}
				if len(got.Calls) != n+1 || rev <= rev0 {
					t.Fatalf("%d calls @%d, want %d after %d", len(got.Calls), rev, n+1, rev0)
				}
				k := 0
				revs.Range(func(any, any) bool { k++; return true })
				if k != n {
					t.Fatalf("%d distinct revisions returned to %d writers, want one each", k, n)
				}
			})
			t.Run("a skipped mutation writes nothing; MutateFrom saves the read", func(t *testing.T) {
				b := kind.open(t)
				ctx := jstest.Ctx(t)
				rev, err := b.Create(ctx, "t-1", batch("t-1", schemas.BatchRunning))
				if err != nil {
					t.Fatal(err)
				}
				if _, srev, err := b.Mutate(ctx, "t-1", func(*schemas.BatchRecord) error { return store.ErrSkip }); err != nil || srev != rev {
					t.Fatalf("skipped: @%d, %v; want @%d", srev, err, rev)
				}
				cur, _, _ := b.Get(ctx, "t-1")
				next, nrev, err := b.MutateFrom(ctx, "t-1", cur, rev, func(r *schemas.BatchRecord) error {
					r.State, r.Text = schemas.BatchAwaiting, "written at awaiting"
					return nil
				})
				if err != nil || nrev <= rev || next.State != schemas.BatchAwaiting {
					t.Fatalf("MutateFrom: %+v @%d, %v", next, nrev, err)
				}
				// From a stale revision: fn is applied to the stale record,
				// its write conflicts, and fn is applied again to the latest.
				stale := batch("t-1", schemas.BatchRunning)
				applied := 0
				last, lrev, err := b.MutateFrom(ctx, "t-1", stale, rev, func(r *schemas.BatchRecord) error {
					applied++
					r.State = schemas.BatchStarted
					return nil
				})
				if err != nil || lrev <= nrev || last.State != schemas.BatchStarted || last.Text != "written at awaiting" || applied != 2 {
					t.Fatalf("MutateFrom a stale revision: %+v @%d, %v, applied %d times; want started over the awaiting write, applied twice", last, lrev, err, applied)
				}
			})
		})
	}
}

// sameRecord reports whether a and b encode the same.
func sameRecord(t *testing.T, a, b *schemas.BatchRecord) bool {
	t.Helper()
	ea, err := schemas.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := schemas.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ea) == string(eb)
}

// Every append of a batch log is told from every other, even one of the
// same bytes at the same place: two writers of one engine racing to claim
// the same call under the same clock reading write identical records, and
// the loser must see a conflict, not take the winner's append for its own
// (TestConcurrentRunsRunACallOnce, pipeline/batch, found it when the
// message id was a digest of the record). A write made again by a new call
// (a stage redelivered after a crash) is a conflict too: the stage reads
// the turn's last event and goes on from it. (A lost acknowledgement
// within one call is recognised: jetstream/turnlog's tests.)
func TestBatchLogTellsEveryAppendFromEveryOther(t *testing.T) {
	b := batchStores[1].open(t).(store.BatchLog)
	ctx := jstest.Ctx(t)
	first := batch("t-1", schemas.BatchRunning)
	rev, err := b.Create(ctx, "t-1", first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(ctx, "t-1", first); !errors.Is(err, store.ErrExists) {
		t.Fatalf("the same create made again: %v; want ErrExists", err)
	}
	next := batch("t-1", schemas.BatchAwaiting)
	rev2, err := b.Update(ctx, "t-1", next, rev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Update(ctx, "t-1", next, rev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the same update made again at the same place: %v; want ErrConflict", err)
	}
	if got, at, err := b.Get(ctx, "t-1"); err != nil || at != rev2 || got.State != schemas.BatchAwaiting {
		t.Fatalf("the batch: %+v @%d %v; want the one update, @%d", got, at, err, rev2)
	}
	if _, err := b.Create(ctx, "t-2", batch("t-1", schemas.BatchRunning)); schemas.CodeOf(err) != schemas.CodeInvalidInput {
		t.Fatalf("t-1's batch kept under t-2: %v, want INVALID_INPUT", err)
	}
	if st := b.Log.Stats(); st.Own != 0 {
		t.Errorf("%d writes recognised as own, want none", st.Own)
	}
}
