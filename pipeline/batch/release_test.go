package batch_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A turn's release writes the session record only to pass it on: the
// terminal batch record is the release (Engine.Release, Acquire). These
// tests drive the engine directly on a real server.

// sessionBatch stores a batch of turn in session, in state, as the
// executor would have.
func sessionBatch(t *testing.T, f *fixture, session, turn string, state schemas.BatchState, calls ...schemas.ToolCall) {
	t.Helper()
	newBatchAs(t, f, turn, state, func(b *schemas.BatchRecord) *schemas.BatchRecord {
		b.SessionID, b.Context = session, turnContextIn(turn, session)
		return b
	}, calls...)
}

// readyNotices are the turns announced on session's ready subject, in
// order.
func readyNotices(t *testing.T, h *pt.H, session string) []string {
	t.Helper()
	var ids []string
	for _, n := range pt.DecodeAll[schemas.TurnNotice](t, h.Messages(topology.StreamTurns, topology.ReadySubject(schemas.SessionKey("cli", session)))) {
		ids = append(ids, n.TurnID)
	}
	return ids
}

func TestAnEndedTurnReleasesItsSessionWithoutAWrite(t *testing.T) {
	f := newFixture(t)
	const session, first, second = "lazy", "t-lazy-1", "t-lazy-2"
	sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
	c0 := call(first, 0, "count", `{}`)
	sessionBatch(t, f, session, first, schemas.BatchRunning, c0)
	if active, err := f.eng.Acquire(ctx(t), sess, first, 0, nil); err != nil || !active {
		t.Fatalf("acquire of a new session: %v %v", active, err)
	}
	_, held, err := f.st.Sessions.Get(ctx(t), sess.Key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.eng.Conclude(ctx(t), first, []*schemas.ToolResult{f.eng.Result(c0, schemas.ResultOK, "", "", "")}, "", ""); err != nil {
		t.Fatal(err)
	}
	s, rev, err := f.st.Sessions.Get(ctx(t), sess.Key)
	if err != nil || rev != held || s.Active != first {
		t.Fatalf("after the turn ended: session %+v at revision %d (%v), want it untouched at %d, naming %s", s, rev, err, held, first)
	}
	// The next turn takes the session at once, in one write.
	sessionBatch(t, f, session, second, schemas.BatchQueued)
	if active, err := f.eng.Acquire(ctx(t), sess, second, 0, nil); err != nil || !active {
		t.Fatalf("acquire after an ended turn: %v %v", active, err)
	}
	if s, rev, _ := f.st.Sessions.Get(ctx(t), sess.Key); s.Active != second || len(s.Queue) != 0 || rev != held+1 {
		// One write: the bucket is the only writer of its stream here.
		t.Fatalf("session %+v at revision %d, want %s active at %d", s, rev, second, held+1)
	}
	// AcquireIfFree takes it the same way.
	if _, err := f.eng.End(ctx(t), second, nil, "", ""); err != nil {
		t.Fatal(err)
	}
	if active, err := f.eng.AcquireIfFree(ctx(t), sess, "t-lazy-3", 0, nil); err != nil || !active {
		t.Fatalf("acquire-if-free after an ended turn: %v %v", active, err)
	}
}

func TestAHolderThatIsNotEndedKeepsItsSession(t *testing.T) {
	f := newFixture(t)
	const session, holder, later = "held", "t-held-1", "t-held-2"
	sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
	sessionBatch(t, f, session, holder, schemas.BatchAwaiting)
	sessionBatch(t, f, session, later, schemas.BatchQueued)
	if active, err := f.eng.Acquire(ctx(t), sess, holder, 0, nil); err != nil || !active {
		t.Fatal(active, err)
	}
	if active, err := f.eng.AcquireIfFree(ctx(t), sess, later, 0, nil); err != nil || active {
		t.Fatalf("acquire-if-free behind a waiting batch: %v %v, want busy", active, err)
	}
	if active, err := f.eng.Acquire(ctx(t), sess, later, 0, nil); err != nil || active {
		t.Fatalf("acquire behind a waiting batch: %v %v, want queued", active, err)
	}
	if s, _, _ := f.st.Sessions.Get(ctx(t), sess.Key); s.Active != holder || !slices.Equal(s.Queue, []string{later}) {
		t.Fatalf("session %+v, want %s active and %s queued", s, holder, later)
	}
	// Nor does a holder with no record yet (it took its free session and
	// its batch is about to be created) give the session up.
	const unrecorded, other = "t-unrecorded", "t-other"
	sess2 := batch.Session{ID: "held-2", Key: schemas.SessionKey("cli", "held-2")}
	if active, err := f.eng.AcquireIfFree(ctx(t), sess2, unrecorded, 0, nil); err != nil || !active {
		t.Fatal(active, err)
	}
	if active, err := f.eng.AcquireIfFree(ctx(t), sess2, other, 0, nil); err != nil || active {
		t.Fatalf("acquire-if-free behind a holder without a record: %v %v, want busy", active, err)
	}
	// Retiring either session changes nothing.
	for _, s := range []batch.Session{sess, sess2} {
		before, rev, _ := f.st.Sessions.Get(ctx(t), s.Key)
		if idle, err := f.eng.RetireSession(ctx(t), s); err != nil || idle {
			t.Fatalf("retire %s: idle %v %v, want held", s.ID, idle, err)
		}
		if after, rev2, _ := f.st.Sessions.Get(ctx(t), s.Key); rev2 != rev || after.Active != before.Active {
			t.Fatalf("retire of a held session %s wrote %+v", s.ID, after)
		}
	}
}

// The race the lazy release must not lose: a turn reads its session held
// by a running turn, that turn ends and its release reads the session
// before the first joins the queue (so it finds no one to pass it to and
// writes nothing), then the first joins the queue. Acquire looks at the
// holder again after it queued the turn, sees it ended and passes the
// session on.
func TestATurnThatQueuesAsItsHolderEndsIsPassedTheSession(t *testing.T) {
	f := newFixture(t)
	h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
	const session, holder, later = "race", "t-race-1", "t-race-2"
	sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
	c0 := call(holder, 0, "count", `{}`)
	sessionBatch(t, f, session, holder, schemas.BatchRunning, c0)
	sessionBatch(t, f, session, later, schemas.BatchQueued)
	if active, err := f.eng.Acquire(ctx(t), sess, holder, 0, nil); err != nil || !active {
		t.Fatal(active, err)
	}
	var once sync.Once
	var endErr error
	f.eng.SetBeforeQueue(func(turn string) {
		once.Do(func() {
			_, endErr = f.eng.Conclude(ctx(t), holder, []*schemas.ToolResult{f.eng.Result(c0, schemas.ResultOK, "", "", "")}, "", "")
		})
	})
	active, err := f.eng.Acquire(ctx(t), sess, later, 0, nil)
	if endErr != nil {
		t.Fatal(endErr)
	}
	if err != nil || active {
		t.Fatalf("acquire: active %v %v, want queued (the pass on announces it)", active, err)
	}
	if s, _, _ := f.st.Sessions.Get(ctx(t), sess.Key); s.Active != later || len(s.Queue) != 0 {
		t.Fatalf("session %+v, want %s passed the session (stuck behind an ended turn?)", s, later)
	}
	if got := readyNotices(t, h, session); !slices.Equal(got, []string{later}) {
		t.Fatalf("ready notices %v, want [%s]", got, later)
	}
}

// A turn ended with turns queued behind it and its release was cut short
// (its stage died after the terminal write): the next Acquire, or
// Release(""), passes the session on in queue order.
func TestAnEndedHolderWithTurnsQueuedIsPassedOn(t *testing.T) {
	for _, tc := range []struct {
		name string
		take func(t *testing.T, f *fixture, sess batch.Session, turn string) (bool, error)
	}{
		{"by a later turn's acquire", func(t *testing.T, f *fixture, sess batch.Session, turn string) (bool, error) {
			return f.eng.Acquire(ctx(t), sess, turn, 0, nil)
		}},
		{"by a later turn's acquire-if-free", func(t *testing.T, f *fixture, sess batch.Session, turn string) (bool, error) {
			return f.eng.AcquireIfFree(ctx(t), sess, turn, 0, nil)
		}},
		{"by the sweep's release", func(t *testing.T, f *fixture, sess batch.Session, _ string) (bool, error) {
			return false, f.eng.Release(ctx(t), sess, "")
		}},
		{"by the sweep's retire", func(t *testing.T, f *fixture, sess batch.Session, _ string) (bool, error) {
			return f.eng.RetireSession(ctx(t), sess)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			h := pt.Start(t, pt.Options{Env: f.env, Stages: []string{}})
			const session, ended, queued, later = "cut", "t-cut-1", "t-cut-2", "t-cut-3"
			sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
			sessionBatch(t, f, session, ended, schemas.BatchCompleted)
			sessionBatch(t, f, session, queued, schemas.BatchQueued)
			sessionBatch(t, f, session, later, schemas.BatchQueued)
			rec := &schemas.SessionRecord{SessionID: session, Active: ended, Queue: []string{queued}, UpdatedAt: time.Now()}
			if _, err := f.st.Sessions.Create(ctx(t), sess.Key, rec); err != nil {
				t.Fatal(err)
			}
			if active, err := tc.take(t, f, sess, later); err != nil || active {
				t.Fatalf("active %v %v, want false: %s is first in the queue", active, err, queued)
			}
			s, _, _ := f.st.Sessions.Get(ctx(t), sess.Key)
			if s.Active != queued || slices.Contains(s.Queue, ended) {
				t.Fatalf("session %+v, want %s active", s, queued)
			}
			if got := readyNotices(t, h, session); !slices.Equal(got, []string{queued}) {
				t.Fatalf("ready notices %v, want [%s]", got, queued)
			}
		})
	}
}

// The write a release skips is made by RetireSession (the recovery
// sweep's, for an idle session): it clears the ended turn and, with a
// retention period, carries the TTL, so the idle record leaves the bucket.
func TestRetireSessionEndsAnIdleRecord(t *testing.T) {
	f := newFixture(t)
	const retention = time.Hour
	f.st.Retain(f.env.JS, retention)
	const session, turn = "idle", "t-idle-1"
	sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
	sessionBatch(t, f, session, turn, schemas.BatchRunning)
	if active, err := f.eng.Acquire(ctx(t), sess, turn, 0, nil); err != nil || !active {
		t.Fatal(active, err)
	}
	stream, err := f.env.JS.Stream(ctx(t), "KV_"+f.st.Sessions.KV.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	ttl := func() string {
		t.Helper()
		m, err := stream.GetLastMsgForSubject(ctx(t), "$KV."+f.st.Sessions.KV.Bucket()+"."+sess.Key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Header.Get(jetstream.MsgTTLHeader)
	}
	if got := ttl(); got != "" {
		t.Fatalf("a held session stored with Nats-TTL %q", got)
	}
	if _, err := f.eng.Conclude(ctx(t), turn, nil, "", ""); err != nil {
		t.Fatal(err)
	}
	if got := ttl(); got != "" {
		t.Fatalf("after its turn ended, the session was written (Nats-TTL %q): the release should write nothing", got)
	}
	for range 2 { // a second retire finds it idle and writes nothing
		if idle, err := f.eng.RetireSession(ctx(t), sess); err != nil || !idle {
			t.Fatalf("retire: idle %v %v", idle, err)
		}
	}
	s, _, err := f.st.Sessions.Get(ctx(t), sess.Key)
	if err != nil || s.Active != "" || len(s.Queue) != 0 {
		t.Fatalf("session %+v %v, want idle", s, err)
	}
	if got := ttl(); got != retention.String() {
		t.Fatalf("the retired session stored with Nats-TTL %q, want %s", got, retention)
	}
}
