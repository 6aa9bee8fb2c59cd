package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// retention is the TTL of the stores these tests retain records with.
const retention = time.Second

func retainedStore(t *testing.T) (*store.Store, context.Context) {
	t.Helper()
	env := jstest.Start(t)
	s := store.New(env.Buckets)
	s.Retain(env.JS, retention)
	return s, jstest.Ctx(t)
}

// ranClaim writes the claim of callID through s as a call that ran leaves
// it: created, then its result recorded. It returns the claim and the
// result write's revision.
func ranClaim(ctx context.Context, t *testing.T, s *store.Store, callID string) (*schemas.ExecutionClaim, uint64) {
	t.Helper()
	c := claim(callID, "w1")
	rev, err := s.Claims.Create(ctx, c.CallID, c)
	if err != nil {
		t.Fatal(err)
	}
	c.Result = &schemas.ToolResult{CallID: c.CallID, Status: schemas.ResultOK}
	if rev, err = s.Claims.Update(ctx, c.CallID, c, rev); err != nil {
		t.Fatal(err)
	}
	return c, rev
}

// gone waits until get reports the key missing, failing the test if it does
// not within the deadline.
func gone(t *testing.T, what string, get func() error) {
	t.Helper()
	jstest.Eventually(t, 20*time.Second, what+" removed", func() bool { return errors.Is(get(), store.ErrNotFound) })
}

func batch(turnID string, state schemas.BatchState) *schemas.BatchRecord {
	call := schemas.ToolCall{CallID: schemas.CallID(turnID, 0), Tool: "echo", Args: `{}`, ArgsDigest: schemas.ArgsDigest(`{}`)}
	return &schemas.BatchRecord{TurnID: turnID, SessionID: "sess-1", State: state, Calls: []schemas.ToolCall{call},
		Approvals: []string{""}, Results: []*schemas.ToolResult{nil}, CreatedAt: now, UpdatedAt: now}
}

// bucketed is batch as a record an earlier version kept in KV bucket
// tollgate_batches: store.Batches writes it there (a batch created now
// goes to its turn's log, which has no TTLs: the stream's MaxAge is its
// retention).
func bucketed(turnID string, state schemas.BatchState) *schemas.BatchRecord {
	return schemas.AsBucketedBatch(batch(turnID, state))
}

// A record that has ended leaves its bucket once its retention has run out,
// and none of its earlier revisions comes back; a record that has not ended
// stays. Each case writes a live record first and an ended one after it:
// the ended one's removal is the later fact that shows the live one was
// kept on purpose, not just not yet removed.
func TestEndedRecordsLeaveAfterTheRetentionAndLiveOnesStay(t *testing.T) {
	s, ctx := retainedStore(t)
	tests := []struct {
		name string
		// live writes a record that must stay, ended one that must go
		// (through writes that leave earlier revisions behind it), and get
		// reads a key back.
		live, ended func(t *testing.T)
		get         func(key string) error
		liveKey     string
		endedKey    string
	}{
		{
			name: "a batch in the bucket: running stays, completed goes",
			live: func(t *testing.T) {
				if _, err := s.Batches.Create(ctx, "t-00000000000000000001", bucketed("t-00000000000000000001", schemas.BatchRunning)); err != nil {
					t.Fatal(err)
				}
			},
			ended: func(t *testing.T) {
				id := "t-00000000000000000002"
				rev, err := s.Batches.Create(ctx, id, bucketed(id, schemas.BatchRunning))
				if err != nil {
					t.Fatal(err)
				}
				if rev, err = s.Batches.Update(ctx, id, bucketed(id, schemas.BatchAwaiting), rev); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Batches.Update(ctx, id, bucketed(id, schemas.BatchCompleted), rev); err != nil {
					t.Fatal(err)
				}
			},
			get:      func(k string) error { _, _, err := s.Batches.Get(ctx, k); return err },
			liveKey:  "t-00000000000000000001",
			endedKey: "t-00000000000000000002",
		},
		{
			name: "a session: busy stays, idle goes",
			live: func(t *testing.T) {
				if _, err := s.Sessions.Create(ctx, "s1", session("s1")); err != nil {
					t.Fatal(err)
				}
			},
			ended: func(t *testing.T) {
				rev, err := s.Sessions.Create(ctx, "s2", session("s2"))
				if err != nil {
					t.Fatal(err)
				}
				idle := session("s2")
				idle.Active = ""
				if _, err := s.Sessions.Update(ctx, "s2", idle, rev); err != nil {
					t.Fatal(err)
				}
			},
			get:      func(k string) error { _, _, err := s.Sessions.Get(ctx, k); return err },
			liveKey:  "s1",
			endedKey: "s2",
		},
		{
			name: "an approval: pending stays, decided goes with its pending revision",
			live: func(t *testing.T) {
				a := approval("t-00000000000000000003")
				if _, err := s.Approvals.Create(ctx, a.ApprovalID, a); err != nil {
					t.Fatal(err)
				}
			},
			ended: func(t *testing.T) {
				a := approval("t-00000000000000000004")
				rev, err := s.Approvals.Create(ctx, a.ApprovalID, a)
				if err != nil {
					t.Fatal(err)
				}
				a.Status = schemas.ApprovalApproved
				if _, err := s.Approvals.Update(ctx, a.ApprovalID, a, rev); err != nil {
					t.Fatal(err)
				}
			},
			get:      func(k string) error { _, _, err := s.Approvals.Get(ctx, k); return err },
			liveKey:  schemas.ApprovalID("t-00000000000000000003", 0),
			endedKey: schemas.ApprovalID("t-00000000000000000004", 0),
		},
		{
			name: "a claim: without a result stays, with one goes",
			live: func(t *testing.T) {
				c := claim("t-00000000000000000005-0", "w1")
				if _, err := s.Claims.Create(ctx, c.CallID, c); err != nil {
					t.Fatal(err)
				}
			},
			ended: func(t *testing.T) {
				ranClaim(ctx, t, s, "t-00000000000000000006-0")
			},
			get:      func(k string) error { _, _, err := s.Claims.Get(ctx, k); return err },
			liveKey:  "t-00000000000000000005-0",
			endedKey: "t-00000000000000000006-0",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.live(t)
			tc.ended(t)
			gone(t, "ended record", func() error { return tc.get(tc.endedKey) })
			if err := tc.get(tc.liveKey); err != nil {
				t.Fatalf("live record after the ended one was removed: %v", err)
			}
		})
	}
}

// A record that ended and then came back to life (a session acquired again
// after it went idle) is written without a TTL and stays.
func TestARecordWrittenLiveAgainStays(t *testing.T) {
	s, ctx := retainedStore(t)
	rev, err := s.Sessions.Create(ctx, "s1", session("s1"))
	if err != nil {
		t.Fatal(err)
	}
	idle := session("s1")
	idle.Active = ""
	if rev, err = s.Sessions.Update(ctx, "s1", idle, rev); err != nil {
		t.Fatal(err)
	}
	if _, err = s.Sessions.Update(ctx, "s1", session("s1"), rev); err != nil {
		t.Fatal(err)
	}
	// The later fact: an idle session written after it is removed.
	c, err := s.Sessions.Create(ctx, "s2", session("s2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sessions.Update(ctx, "s2", idle, c); err != nil {
		t.Fatal(err)
	}
	gone(t, "idle session", func() error { _, _, err := s.Sessions.Get(ctx, "s2"); return err })
	if got, _, err := s.Sessions.Get(ctx, "s1"); err != nil || got.Active == "" {
		t.Fatalf("session acquired again: %+v, %v; want it kept, active", got, err)
	}
}

// The write that starts a TTL is a compare-and-set like any other: at a
// stale revision it fails with ErrConflict and writes nothing.
func TestAnEndingWriteAtAStaleRevisionConflicts(t *testing.T) {
	s, ctx := retainedStore(t)
	id := "t-00000000000000000001"
	rev, err := s.Batches.Create(ctx, id, bucketed(id, schemas.BatchRunning))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Batches.Update(ctx, id, bucketed(id, schemas.BatchAwaiting), rev); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Batches.Update(ctx, id, bucketed(id, schemas.BatchCompleted), rev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("terminal write at a stale revision: %v, want ErrConflict", err)
	}
	if got, _, err := s.Batches.Get(ctx, id); err != nil || got.State != schemas.BatchAwaiting || !got.Bucketed() {
		t.Fatalf("after the failed write: %+v, %v; want awaiting, in the bucket", got, err)
	}
}

// A batch kept in its turn's log is never written to KV, not when it ends
// and not when it is retired: nothing there to expire, and it stays in
// its log (whose retention is the stream's MaxAge) after a bucketed batch
// that ended after it has left the bucket.
func TestALogKeptBatchIsNotWrittenToKV(t *testing.T) {
	s, ctx := retainedStore(t)
	id := "t-00000000000000000001"
	rev, err := s.Batches.Create(ctx, id, batch(id, schemas.BatchRunning))
	if err != nil {
		t.Fatal(err)
	}
	if rev, err = s.Batches.Update(ctx, id, batch(id, schemas.BatchCompleted), rev); err != nil {
		t.Fatal(err)
	}
	if err := s.Batches.Retire(ctx, id); err != nil {
		t.Fatal(err)
	}
	bucketEmpty(t, ctx, s, id)

	// The later fact: a bucketed batch ended after it leaves KV.
	later := "t-00000000000000000002"
	if _, err := s.Batches.Create(ctx, later, bucketed(later, schemas.BatchCompleted)); err != nil {
		t.Fatal(err)
	}
	gone(t, "bucketed batch ended later", func() error { _, _, err := s.Batches.Get(ctx, later); return err })
	if got, grev, err := s.Batches.Get(ctx, id); err != nil || grev != rev || got.State != schemas.BatchCompleted || got.Bucketed() {
		t.Fatalf("the log-kept batch: %+v @%d, %v; want it completed @%d, in its log", got, grev, err, rev)
	}
	bucketEmpty(t, ctx, s, id)
}

// A store without retention keeps ended records: nothing is written with
// a TTL (a retained store's record, written after, is removed first).
func TestAStoreWithoutRetentionKeepsEndedRecords(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	keep := store.New(env.Buckets)
	retained := store.New(env.Buckets)
	retained.Retain(env.JS, retention)
	for _, s := range []*store.Store{keep, retained} {
		id := "t-0000000000000000000" + map[*store.Store]string{keep: "1", retained: "2"}[s]
		if _, err := s.Batches.Create(ctx, id, bucketed(id, schemas.BatchCompleted)); err != nil {
			t.Fatal(err)
		}
		if err := s.Claims.Retire(ctx, id+"-0"); err != nil {
			t.Fatal(err)
		}
	}
	gone(t, "retained batch", func() error { _, _, err := retained.Batches.Get(ctx, "t-00000000000000000002"); return err })
	if _, _, err := keep.Batches.Get(ctx, "t-00000000000000000001"); err != nil {
		t.Fatalf("batch of the store without retention: %v", err)
	}
}

// Retire writes a record again only if its latest revision has no TTL yet:
// a claim whose result was written with the TTL is left as it is (a read,
// no write); a record written without one gets it.
func TestRetireWritesOnlyRecordsWithoutATTL(t *testing.T) {
	s, ctx := retainedStore(t)
	c, rev := ranClaim(ctx, t, s, "t-00000000000000000007-0")
	if err := s.Claims.Retire(ctx, c.CallID); err != nil {
		t.Fatal(err)
	}
	if _, got, err := s.Claims.Get(ctx, c.CallID); err != nil || got != rev {
		t.Fatalf("claim after Retire: revision %d, %v; want %d (not written again)", got, err, rev)
	}

	// A record without a TTL (a batch in the bucket: written live) is
	// rewritten with one; retired again, it is left as it is.
	id := "t-00000000000000000008"
	brev, err := s.Batches.Create(ctx, id, bucketed(id, schemas.BatchAwaiting))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Batches.Retire(ctx, id); err != nil {
		t.Fatal(err)
	}
	_, retired, err := s.Batches.Get(ctx, id)
	if err != nil || retired <= brev {
		t.Fatalf("batch after Retire: revision %d, %v; want a write after %d", retired, err, brev)
	}
	if err := s.Batches.Retire(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, again, err := s.Batches.Get(ctx, id); err != nil || again != retired {
		t.Fatalf("batch retired twice: revision %d, %v; want %d (the second left it)", again, err, retired)
	}
	gone(t, "retired batch", func() error { _, _, err := s.Batches.Get(ctx, id); return err })
}

// A claim whose result an earlier version wrote without a TTL (it retired
// claims when their batch ended) is retired so by this one: the read finds
// no TTL, the rewrite adds it, and the claim leaves KV.
func TestAClaimFromAnEarlierVersionIsRetiredAtItsBatchEnd(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	earlier := store.New(env.Buckets) // no retention: writes carry no TTL
	now := store.New(env.Buckets)
	now.Retain(env.JS, retention)
	c, rev := ranClaim(ctx, t, earlier, "t-00000000000000000009-0")
	if err := now.Claims.Retire(ctx, c.CallID); err != nil {
		t.Fatal(err)
	}
	if _, got, err := now.Claims.Get(ctx, c.CallID); err != nil || got <= rev {
		t.Fatalf("claim after Retire: revision %d, %v; want a rewrite after %d", got, err, rev)
	}
	gone(t, "claim of an earlier version, retired", func() error { _, _, err := now.Claims.Get(ctx, c.CallID); return err })
}
