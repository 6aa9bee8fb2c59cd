package store_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

var now = time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC)

// newStore is a store over a fresh server, writing through KV, or, while
// published is set (by TestThroughJetStream), through JetStream publishes
// as the stages do (Store.Retain).
func newStore(t *testing.T) (*store.Store, context.Context) {
	t.Helper()
	env := jstest.Start(t)
	s := store.New(env.Buckets)
	if published {
		s.Retain(env.JS, 0)
	}
	return s, jstest.Ctx(t)
}

var published bool

// The store's contract holds when its writes are JetStream publishes with
// the compare-and-set as a header (Bucket.JS, set by Store.Retain), as the
// stages make them, and not KV calls: the same tests, that way.
func TestThroughJetStream(t *testing.T) {
	published = true
	t.Cleanup(func() { published = false })
	for name, test := range map[string]func(*testing.T){
		"CreateThenGet":                TestCreateThenGet,
		"CreateExistingKey":            TestCreateExistingKey,
		"CreateAfterDelete":            TestCreateAfterDelete,
		"ConcurrentCreateHasOneWinner": TestConcurrentCreateHasOneWinner,
		"Update":                       TestUpdate,
		"UpdateRejectsInvalidRecord":   TestUpdateRejectsInvalidRecord,
		"MutateUnderContention":        TestMutateUnderContention,
		"MutateSkip":                   TestMutateSkip,
		"MutateError":                  TestMutateError,
		"MutateFromAKnownRevision":     TestMutateFromAKnownRevision,
	} {
		t.Run(name, test)
	}
}

func session(id string) *schemas.SessionRecord {
	return &schemas.SessionRecord{SessionID: id, Active: "t-00000000000000000001", Queue: []string{}, UpdatedAt: now}
}

func approval(turnID string) *schemas.ApprovalRecord {
	return &schemas.ApprovalRecord{
		ApprovalID: schemas.ApprovalID(turnID, 0),
		TurnID:     turnID,
		SessionID:  "sess-1",
		CallID:     schemas.CallID(turnID, 0),
		Context: &schemas.TurnContext{
			V:         schemas.TurnContextVersion,
			SessionID: "sess-1",
			TurnID:    turnID,
			Requester: schemas.Requester{
				Principal: "slack:U1", SenderID: "U1", Kind: schemas.SenderUser, Verified: true,
			},
			Transport:     "slack",
			Channel:       schemas.Channel{ID: "C1", Kind: schemas.ChannelDM},
			Audience:      schemas.AudiencePersonal,
			TrustBoundary: "acme",
			Interactive:   true,
			Provenance:    schemas.Provenance{Transport: "slack", MessageID: "m1", StreamSeq: 7, ReceivedAt: now, IngestedBy: "ingest-1"},
			CreatedAt:     now,
		},
		Tool:          "email.send",
		Args:          `{"to":"a@example.com"}`,
		ArgsDigest:    schemas.ArgsDigest(`{"to":"a@example.com"}`),
		PolicyVersion: "p1",
		Options:       []string{schemas.OptionApprove, schemas.OptionDeny},
		Status:        schemas.ApprovalPending,
		RequestedAt:   now,
		ExpiresAt:     now.Add(time.Hour),
	}
}

// inUTC returns a copy of a with its times in UTC (the decoder returns them
// in time.Local) for comparison.
func inUTC(a schemas.ApprovalRecord) schemas.ApprovalRecord {
	c := *a.Context
	c.CreatedAt = c.CreatedAt.UTC()
	c.Provenance.ReceivedAt = c.Provenance.ReceivedAt.UTC()
	a.Context = &c
	a.RequestedAt, a.ExpiresAt = a.RequestedAt.UTC(), a.ExpiresAt.UTC()
	return a
}

func TestCreateThenGet(t *testing.T) {
	s, ctx := newStore(t)
	turn := schemas.TurnID("slack", "m1")
	want := approval(turn)
	key := want.ApprovalID

	rev, err := s.Approvals.Create(ctx, key, want)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if rev == 0 {
		t.Fatal("create returned revision 0")
	}
	got, gotRev, err := s.Approvals.Get(ctx, key)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if gotRev != rev {
		t.Errorf("get revision %d, create returned %d", gotRev, rev)
	}
	if want.V != schemas.ApprovalVersion {
		t.Errorf("create did not stamp the version: v=%d", want.V)
	}
	if !reflect.DeepEqual(inUTC(*got), inUTC(*want)) {
		t.Errorf("round trip\n got %#v\nwant %#v", got, want)
	}
	if err := got.Context.CheckFor(turn); err != nil {
		t.Errorf("persisted context is not usable: %v", err)
	}
}

func TestCreateExistingKey(t *testing.T) {
	s, ctx := newStore(t)
	first := session("sess-1")
	rev, err := s.Sessions.Create(ctx, "s-1", first)
	if err != nil {
		t.Fatalf("first create: %v", err)
	}
	second := session("sess-1")
	second.Active = "t-00000000000000000002"
	_, err = s.Sessions.Create(ctx, "s-1", second)
	if !errors.Is(err, store.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	got, gotRev, err := s.Sessions.Get(ctx, "s-1")
	if err != nil {
		t.Fatal(err)
	}
	if gotRev != rev || got.Active != first.Active {
		t.Errorf("the losing create changed the record: rev %d active %s", gotRev, got.Active)
	}
}

func TestCreateAfterDelete(t *testing.T) {
	s, ctx := newStore(t)
	if _, err := s.Claims.Create(ctx, "c-1", claim("c-1", "w1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Claims.KV.Delete(ctx, "c-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claims.Create(ctx, "c-1", claim("c-1", "w2")); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
	got, _, err := s.Claims.Get(ctx, "c-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Worker != "w2" {
		t.Errorf("worker %q, want w2", got.Worker)
	}
}

func claim(callID, worker string) *schemas.ExecutionClaim {
	return &schemas.ExecutionClaim{CallID: callID, TurnID: "t-1", Tool: "email.send", ArgsDigest: "sha256:00", Worker: worker, ClaimedAt: now}
}

func TestConcurrentCreateHasOneWinner(t *testing.T) {
	s, ctx := newStore(t)
	const n = 8
	var wins atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Claims.Create(ctx, "c-race", claim("c-race", fmt.Sprintf("w%d", i)))
			switch {
			case err == nil:
				wins.Add(1)
			case !errors.Is(err, store.ErrExists):
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("create: %v, want nil or ErrExists", err)
	}
	if w := wins.Load(); w != 1 {
		t.Errorf("%d creates won, want exactly 1", w)
	}
}

func TestUpdate(t *testing.T) {
	s, ctx := newStore(t)
	rec := session("sess-1")
	rev, err := s.Sessions.Create(ctx, "s-1", rec)
	if err != nil {
		t.Fatal(err)
	}
	rec.Queue = append(rec.Queue, "t-2")
	rev2, err := s.Sessions.Update(ctx, "s-1", rec, rev)
	if err != nil {
		t.Fatalf("update at the current revision: %v", err)
	}
	if rev2 <= rev {
		t.Errorf("revision went from %d to %d", rev, rev2)
	}

	stale := session("sess-1")
	stale.Active = "t-stale"
	if _, err := s.Sessions.Update(ctx, "s-1", stale, rev); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("update at a stale revision: %v, want ErrConflict", err)
	}
	if _, err := s.Sessions.Update(ctx, "s-1", stale, rev2+100); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("update at a future revision: %v, want ErrConflict", err)
	}
	got, gotRev, err := s.Sessions.Get(ctx, "s-1")
	if err != nil {
		t.Fatal(err)
	}
	if gotRev != rev2 || got.Active == "t-stale" || len(got.Queue) != 1 {
		t.Errorf("after rejected updates: rev %d (want %d), record %+v", gotRev, rev2, got)
	}
}

func TestUpdateRejectsInvalidRecord(t *testing.T) {
	s, ctx := newStore(t)
	rev, err := s.Sessions.Create(ctx, "s-1", session("sess-1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sessions.Update(ctx, "s-1", &schemas.SessionRecord{}, rev); schemas.CodeOf(err) != schemas.CodeInvalidInput {
		t.Fatalf("update with an invalid record: %v, want INVALID_INPUT", err)
	}
	if _, err := s.Sessions.Create(ctx, "s-2", &schemas.SessionRecord{}); schemas.CodeOf(err) != schemas.CodeInvalidInput {
		t.Fatalf("create with an invalid record: %v, want INVALID_INPUT", err)
	}
	if _, _, err := s.Sessions.Get(ctx, "s-2"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an invalid create wrote something: %v", err)
	}
	if _, gotRev, err := s.Sessions.Get(ctx, "s-1"); err != nil || gotRev != rev {
		t.Errorf("an invalid update wrote something: rev %d, %v", gotRev, err)
	}
}

func TestGetMissing(t *testing.T) {
	s, ctx := newStore(t)
	cases := []struct {
		name  string
		setup func(t *testing.T, key string)
	}{
		{"never written", func(*testing.T, string) {}},
		{"deleted", func(t *testing.T, key string) {
			if _, err := s.Sessions.Create(ctx, key, session("sess-1")); err != nil {
				t.Fatal(err)
			}
			if err := s.Sessions.KV.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}},
		{"purged", func(t *testing.T, key string) {
			if _, err := s.Sessions.Create(ctx, key, session("sess-1")); err != nil {
				t.Fatal(err)
			}
			if err := s.Sessions.KV.Purge(ctx, key); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("k%d", i)
			tc.setup(t, key)
			rec, _, err := s.Sessions.Get(ctx, key)
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("get: %v, want ErrNotFound", err)
			}
			if rec != nil {
				t.Errorf("get returned %+v", rec)
			}
		})
	}
}

// A stored value this build cannot read is an error with a code, never a
// guess, and never "not found" (which a caller might answer by creating a
// fresh record over it).
func TestGetUndecodableValue(t *testing.T) {
	s, ctx := newStore(t)
	future, err := msgpack.Marshal(map[string]any{"v": 99, "session_id": "sess-1", "active": "t-1", "queue": []string{}})
	if err != nil {
		t.Fatal(err)
	}
	legacy, err := msgpack.Marshal(map[string]any{"v": 1, "approval_id": "a-1-0", "turn_id": "t-1", "call_id": "t-1-0", "tool": "x", "status": "pending"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		kv   jetstream.KeyValue
		get  func(key string) (uint64, error)
		raw  []byte
		want schemas.Code
	}{
		{"a future session version", s.Sessions.KV, func(k string) (uint64, error) {
			_, rev, err := s.Sessions.Get(ctx, k)
			return rev, err
		}, future, schemas.CodeSchemaVersionUnsupported},
		{"a legacy approval record", s.Approvals.KV, func(k string) (uint64, error) {
			_, rev, err := s.Approvals.Get(ctx, k)
			return rev, err
		}, legacy, schemas.CodeSchemaVersionUnsupported},
		{"bytes that are not msgpack", s.Batches.KV, func(k string) (uint64, error) {
			_, rev, err := s.Batches.Get(ctx, k)
			return rev, err
		}, []byte("{json?}"), schemas.CodeMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rev, err := tc.kv.Put(ctx, "raw", tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			gotRev, err := tc.get("raw")
			if code := schemas.CodeOf(err); code != tc.want {
				t.Fatalf("get: %v, want code %s", err, tc.want)
			}
			if errors.Is(err, store.ErrNotFound) {
				t.Errorf("an undecodable value reads as not found")
			}
			if gotRev != rev {
				t.Errorf("revision %d with the error, want %d", gotRev, rev)
			}
		})
	}

	t.Run("Mutate does not touch it", func(t *testing.T) {
		rev, err := s.Sessions.KV.Put(ctx, "raw2", future)
		if err != nil {
			t.Fatal(err)
		}
		called := false
		_, _, err = s.Sessions.Mutate(ctx, "raw2", func(*schemas.SessionRecord) error { called = true; return nil })
		if schemas.CodeOf(err) != schemas.CodeSchemaVersionUnsupported {
			t.Fatalf("mutate: %v", err)
		}
		if called {
			t.Error("mutate called its function on an undecodable record")
		}
		e, err := s.Sessions.KV.Get(ctx, "raw2")
		if err != nil {
			t.Fatal(err)
		}
		if e.Revision() != rev || string(e.Value()) != string(future) {
			t.Errorf("the raw value was rewritten")
		}
	})
}

// Many writers appending to one record through Mutate: every append lands
// exactly once, however the compare-and-sets interleave.
func TestMutateUnderContention(t *testing.T) {
	s, ctx := newStore(t)
	rev0, err := s.Sessions.Create(ctx, "s-1", session("sess-1"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	// Every writer's first attempt waits until all have read the record, so
	// all of them start from the same revision and n-1 must retry.
	var firstRead sync.WaitGroup
	firstRead.Add(n)
	var calls atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			_, _, err := s.Sessions.Mutate(ctx, "s-1", func(r *schemas.SessionRecord) error {
				calls.Add(1)
				if first {
					first = false
					firstRead.Done()
					firstRead.Wait()
				}
				r.Queue = append(r.Queue, fmt.Sprintf("t-%02d", i))
				return nil
			})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("mutate: %v", err)
	}
	got, rev, err := s.Sessions.Get(ctx, "s-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Queue) != n {
		t.Fatalf("queue has %d entries, want %d: %v", len(got.Queue), n, got.Queue)
	}
	seen := map[string]bool{}
	for _, q := range got.Queue {
		if seen[q] {
			t.Errorf("%s appended twice", q)
		}
		seen[q] = true
	}
	if rev != rev0+n {
		t.Errorf("revision %d, want %d (one write per writer)", rev, rev0+n)
	}
	if c := calls.Load(); c < 2*n-1 {
		t.Errorf("the function ran %d times; contention should force at least %d", c, 2*n-1)
	}
}

func TestMutateSkip(t *testing.T) {
	s, ctx := newStore(t)
	rev, err := s.Sessions.Create(ctx, "s-1", session("sess-1"))
	if err != nil {
		t.Fatal(err)
	}
	got, gotRev, err := s.Sessions.Mutate(ctx, "s-1", func(r *schemas.SessionRecord) error {
		r.Active = "changed but skipped"
		return store.ErrSkip
	})
	if err != nil {
		t.Fatalf("mutate: %v", err)
	}
	if gotRev != rev || got == nil || got.SessionID != "sess-1" {
		t.Errorf("mutate returned rev %d (want %d) and %+v", gotRev, rev, got)
	}
	if _, latest, err := s.Sessions.Get(ctx, "s-1"); err != nil || latest != rev {
		t.Errorf("ErrSkip wrote: revision %d, want %d (%v)", latest, rev, err)
	}
	st, err := s.Sessions.KV.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Values() != 1 {
		t.Errorf("bucket holds %d values, want 1", st.Values())
	}
}

func TestMutateError(t *testing.T) {
	s, ctx := newStore(t)
	rev, err := s.Sessions.Create(ctx, "s-1", session("sess-1"))
	if err != nil {
		t.Fatal(err)
	}
	boom := schemas.Errorf(schemas.CodeBatchStateInvalid, "no")
	_, _, err = s.Sessions.Mutate(ctx, "s-1", func(r *schemas.SessionRecord) error {
		r.Active = "x"
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("mutate: %v, want the function's error", err)
	}
	if _, latest, _ := s.Sessions.Get(ctx, "s-1"); latest != rev {
		t.Errorf("a failed mutate wrote: revision %d, want %d", latest, rev)
	}

	called := false
	_, _, err = s.Sessions.Mutate(ctx, "missing", func(*schemas.SessionRecord) error { called = true; return nil })
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("mutate of a missing key: %v, want ErrNotFound", err)
	}
	if called {
		t.Error("mutate called its function for a missing key")
	}
}

// Writing back a record whose persisted TurnContext has a version this build
// does not know (a status change through Mutate, say) must keep that version,
// so the context still fails closed afterwards.
func TestMutateKeepsUnknownContextVersion(t *testing.T) {
	s, ctx := newStore(t)
	a := approval(schemas.TurnID("slack", "m1"))
	a.Context.V = 9
	if _, err := s.Approvals.Create(ctx, a.ApprovalID, a); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.Approvals.Mutate(ctx, a.ApprovalID, func(r *schemas.ApprovalRecord) error {
		r.Status = schemas.ApprovalDenied
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Approvals.Get(ctx, a.ApprovalID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != schemas.ApprovalDenied {
		t.Errorf("status %s", got.Status)
	}
	if got.Context.V != 9 {
		t.Errorf("context version became %d", got.Context.V)
	}
	if code := schemas.CodeOf(got.Context.CheckFor(got.TurnID)); code != schemas.CodeSchemaVersionUnsupported {
		t.Errorf("context check: %q, want SCHEMA_VERSION_UNSUPPORTED", code)
	}
}

func TestMutateFromAKnownRevision(t *testing.T) {
	s, ctx := newStore(t)
	if _, err := s.Sessions.Create(ctx, "s-1", session("sess-1")); err != nil {
		t.Fatal(err)
	}
	queue := func(turn string) func(r *schemas.SessionRecord) error {
		return func(r *schemas.SessionRecord) error { r.Queue = append(r.Queue, turn); return nil }
	}
	tests := []struct {
		name  string
		stale bool
	}{
		{"the revision the caller holds is current: one write", false},
		{"someone wrote since: it reads again and applies the change to the newer record", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur, curRev, err := s.Sessions.Get(ctx, "s-1")
			if err != nil {
				t.Fatal(err)
			}
			want := append(append([]string(nil), cur.Queue...), "mine")
			if tt.stale {
				other, _, err := s.Sessions.Mutate(ctx, "s-1", queue("theirs"))
				if err != nil {
					t.Fatal(err)
				}
				want = append(append([]string(nil), other.Queue...), "mine")
			}
			got, gotRev, err := s.Sessions.MutateFrom(ctx, "s-1", cur, curRev, queue("mine"))
			if err != nil {
				t.Fatal(err)
			}
			stored, storedRev, err := s.Sessions.Get(ctx, "s-1")
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(stored.Queue) != fmt.Sprint(want) || fmt.Sprint(got.Queue) != fmt.Sprint(want) || gotRev != storedRev {
				t.Fatalf("stored %v at %d, returned %v at %d; want %v", stored.Queue, storedRev, got.Queue, gotRev, want)
			}
		})
	}
}
