package batch_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The session order's rule (order.go), driven on a real server: entries
// appended as ingest appends them, batches placed as the stages place
// them.

// line appends turns to session's order in order and returns their
// entries; a turn named twice is appended again as a repeat (arrival i).
func line(t *testing.T, f *fixture, session string, turns ...string) []*turnorder.Entry {
	t.Helper()
	w, err := f.eng.Orders(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []*turnorder.Entry
	for i, turn := range turns {
		a := turnorder.Append{Kind: topology.OrderExec, Key: schemas.SessionKey("cli", session), Turn: turn, Arrival: uint64(100 + i),
			Data: []byte("an accepted turn"), Repeat: seen[turn]}
		e, err := w.Append(ctx(t), a)
		if err != nil {
			t.Fatal(err)
		}
		seen[turn] = true
		out = append(out, e)
	}
	return out
}

// placed stores turn's batch in state at the place e gives it (Place).
func placed(t *testing.T, f *fixture, session string, e *turnorder.Entry, state schemas.BatchState) *schemas.BatchRecord {
	t.Helper()
	p, err := f.eng.Place(ctx(t), e)
	if err != nil {
		t.Fatal(err)
	}
	return newBatchAs(t, f, e.Turn, state, func(b *schemas.BatchRecord) *schemas.BatchRecord {
		b.SessionID, b.Context = session, turnContextIn(e.Turn, session)
		b.OrderSeq, b.OrderAfter = p.Seq, p.After
		return b
	})
}

func itsTurn(t *testing.T, f *fixture, turn string) bool {
	t.Helper()
	b, _, err := f.st.Batches.Get(ctx(t), turn)
	if err != nil {
		t.Fatal(err)
	}
	its, err := f.eng.ItsTurn(ctx(t), b)
	if err != nil {
		t.Fatal(err)
	}
	return its
}

// readyIDs are the message ids of the ready notices on session's ready
// subject.
func readyIDs(t *testing.T, f *fixture, session string) []string {
	t.Helper()
	s, err := f.env.JS.Stream(ctx(t), topology.StreamTurns)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx(t), seq, jetstream.WithGetMsgSubject(topology.ReadySubject(schemas.SessionKey("cli", session))))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return ids
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
		seq = m.Sequence + 1
	}
}

func TestABatchRunsOnlyOnceTheBatchBeforeItHasEnded(t *testing.T) {
	f := newFixture(t)
	const session = "line"
	es := line(t, f, session, "t-line-a", "t-line-b", "t-line-c")
	placed(t, f, session, es[0], schemas.BatchRunning)
	b := placed(t, f, session, es[1], schemas.BatchQueued)
	c := placed(t, f, session, es[2], schemas.BatchQueued)
	if b.OrderAfter != "t-line-a" || c.OrderAfter != "t-line-b" || c.OrderSeq != es[2].Seq {
		t.Fatalf("places: b after %q, c after %q at %d; want a, b, and c's entry %d", b.OrderAfter, c.OrderAfter, c.OrderSeq, es[2].Seq)
	}
	for turn, want := range map[string]bool{"t-line-a": true, "t-line-b": false, "t-line-c": false} {
		if got := itsTurn(t, f, turn); got != want {
			t.Fatalf("ItsTurn(%s) = %v, want %v", turn, got, want)
		}
	}

	// A batch is not ended out of its turn: it stays queued.
	if _, err := f.eng.End(ctx(t), "t-line-c", nil, schemas.CodeInvalidInput, "given up"); !errors.Is(err, batch.ErrNotItsTurn) {
		t.Fatalf("End of a batch whose turn has not come: %v, want ErrNotItsTurn", err)
	}
	if err := f.eng.Abort(ctx(t), "t-line-c", schemas.CodeInvalidInput, "given up"); err != nil {
		t.Fatalf("Abort of a batch whose turn has not come: %v, want it left queued", err)
	}
	if got, _, _ := f.st.Batches.Get(ctx(t), "t-line-c"); got.State != schemas.BatchQueued {
		t.Fatalf("the batch out of its turn is %s, want queued", got.State)
	}
	if ids := readyIDs(t, f, session); len(ids) != 0 {
		t.Fatalf("ready notices %v before anything ended", ids)
	}

	// A wake before the first ended announces nothing.
	if woke := wake(t, f, "t-line-b"); woke {
		t.Fatal("Wake announced the second turn while the first runs")
	}
	// The first one's end announces nothing itself (the redriver's watch
	// of the turn logs wakes the turn after it); the wake of the second
	// announces it, after the first, and the third's wake nothing.
	if _, err := f.eng.Conclude(ctx(t), "t-line-a", nil, "", ""); err != nil {
		t.Fatal(err)
	}
	if ids := readyIDs(t, f, session); len(ids) != 0 {
		t.Fatalf("ready notices %v from the end itself, want none", ids)
	}
	if !wake(t, f, "t-line-b") || wake(t, f, "t-line-c") {
		t.Fatal("after the first ended: want the second woken, and not the third")
	}
	if ids := readyIDs(t, f, session); len(ids) != 1 || ids[0] != topology.ReadyAfterMsgID("t-line-b", "t-line-a") {
		t.Fatalf("ready notices %v, want the second turn's, after the first", ids)
	}
	if !itsTurn(t, f, "t-line-b") || itsTurn(t, f, "t-line-c") {
		t.Fatal("after the first ended: want the second's turn come, and not the third's")
	}
	// A second wake of the second (another redriver's watch) publishes the
	// same notice again (deduplicated): nothing new; nor does a repeated
	// Finish of the first.
	a, _, _ := f.st.Batches.Get(ctx(t), "t-line-a")
	if err := f.eng.Finish(ctx(t), a); err != nil {
		t.Fatal(err)
	}
	if !wake(t, f, "t-line-b") {
		t.Fatal("a second wake of the queued second turn announced nothing")
	}
	if ids := readyIDs(t, f, session); len(ids) != 1 {
		t.Fatalf("ready notices %v after a second wake, want the one", ids)
	}
	// An ended batch (also its session's first entry) and one that is
	// gone are not woken.
	for _, turn := range []string{"t-line-a", "t-line-none"} {
		if wake(t, f, turn) {
			t.Fatalf("Wake(%s) announced", turn)
		}
	}
}

// wake is Engine.Wake of turn.
func wake(t *testing.T, f *fixture, turn string) bool {
	t.Helper()
	woke, err := f.eng.Wake(ctx(t), turn)
	if err != nil {
		t.Fatal(err)
	}
	return woke
}

// A transport's retry under another message id adds a repeated entry of
// an earlier turn after a later one: W, X, W again, T. T's predecessor is
// X (the repeat places nothing), and X's end wakes T, stepping over it.
func TestAPlaceStepsOverARepeatedEntry(t *testing.T) {
	f := newFixture(t)
	const session = "repeat"
	es := line(t, f, session, "t-rep-w", "t-rep-x", "t-rep-w", "t-rep-t")
	if !es[2].Repeated() || es[3].After != "t-rep-w" {
		t.Fatalf("the third entry should be a repeat of w, the fourth after it: %+v %+v", es[2], es[3])
	}
	placed(t, f, session, es[0], schemas.BatchCompleted)
	placed(t, f, session, es[1], schemas.BatchRunning)
	if p, err := f.eng.Place(ctx(t), es[2]); err != nil || p != (batch.Placed{}) {
		t.Fatalf("the repeat's place %+v (%v), want none", p, err)
	}
	tb := placed(t, f, session, es[3], schemas.BatchQueued)
	if tb.OrderAfter != "t-rep-x" {
		t.Fatalf("t's predecessor is %q, want x (w's repeat places nothing)", tb.OrderAfter)
	}
	if itsTurn(t, f, "t-rep-t") {
		t.Fatal("t's turn came while x runs")
	}
	if _, err := f.eng.Conclude(ctx(t), "t-rep-x", nil, "", ""); err != nil {
		t.Fatal(err)
	}
	if !wake(t, f, "t-rep-t") {
		t.Fatal("t was not woken after x ended")
	}
	if ids := readyIDs(t, f, session); len(ids) != 1 || ids[0] != topology.ReadyAfterMsgID("t-rep-t", "t-rep-x") {
		t.Fatalf("ready notices %v, want t's after x", ids)
	}
	if !itsTurn(t, f, "t-rep-t") {
		t.Fatal("t's turn has not come after x ended")
	}
}

// A session's first entry whose session record (an earlier version's)
// names a turn that still holds the session joins that record's queue,
// and its turn comes when that turn's end passes the session on.
func TestAFirstEntryWaitsBehindAnEarlierVersionsTurn(t *testing.T) {
	f := newFixture(t)
	const session = "upgraded"
	sess := batch.Session{ID: session, Key: schemas.SessionKey("cli", session)}
	sessionBatch(t, f, session, "t-old", schemas.BatchRunning)
	if active, err := f.eng.Acquire(ctx(t), sess, "t-old", 0, nil); err != nil || !active {
		t.Fatalf("the earlier version's turn takes its session: %v %v", active, err)
	}
	es := line(t, f, session, "t-new")
	nb := placed(t, f, session, es[0], schemas.BatchQueued)
	if nb.OrderAfter != "" {
		t.Fatalf("the first entry names %q before it", nb.OrderAfter)
	}
	if its, err := f.eng.ItsTurnNow(ctx(t), nb); err != nil || its {
		t.Fatalf("ItsTurnNow = %v, %v; want false while the earlier turn holds the session", its, err)
	}
	if itsTurn(t, f, "t-new") {
		t.Fatal("the first entry's turn came while the earlier version's turn runs")
	}
	if s, _, err := f.st.Sessions.Get(ctx(t), sess.Key); err != nil || s.Active != "t-old" || len(s.Queue) != 1 || s.Queue[0] != "t-new" {
		t.Fatalf("session record %+v (%v), want t-new queued behind t-old", s, err)
	}
	if _, err := f.eng.Conclude(ctx(t), "t-old", nil, "", ""); err != nil {
		t.Fatal(err)
	}
	if !itsTurn(t, f, "t-new") {
		t.Fatal("the first entry's turn has not come after the earlier turn ended")
	}
	if ids := readyIDs(t, f, session); len(ids) != 1 || ids[0] != topology.ReadyMsgID("t-new") {
		t.Fatalf("ready notices %v, want the record's release announcing t-new", ids)
	}
}

// TestAFirstEntryReadsNoSessionRecordWhileTheViewIsCurrent: a session's
// first entry runs at once unless an earlier version's record holds the
// session. A stage that follows the records' view decides a session with
// no record without reading it; a session with a record, and every
// session while the view is not followed, is read.
func TestAFirstEntryReadsNoSessionRecordWhileTheViewIsCurrent(t *testing.T) {
	f := newFixture(t)
	// Every read of a session record is a direct get on the bucket.
	prefix := "$JS.API.DIRECT.GET.KV_" + f.st.Sessions.KV.Bucket() + ".$KV." + f.st.Sessions.KV.Bucket() + "."
	gets, err := f.env.NC.SubscribeSync(prefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	key := func(session string) string { return schemas.SessionKey("cli", session) }
	first := func(session, turn string) bool {
		t.Helper()
		placed(t, f, session, line(t, f, session, turn)[0], schemas.BatchQueued)
		return itsTurn(t, f, turn)
	}
	// nextGet is the key of the next record read.
	nextGet := func() string {
		t.Helper()
		m, err := gets.NextMsg(jstest.Wait)
		if err != nil {
			t.Fatalf("no read of a session record came: %v", err)
		}
		return strings.TrimPrefix(m.Subject, prefix)
	}

	if !first("unfollowed", "t-a") {
		t.Fatal("a new session's first entry waits, with the view not followed")
	}
	if k := nextGet(); k != key("unfollowed") {
		t.Fatalf("read %s; want the unfollowed session's record read", k)
	}

	release := f.eng.FollowRecords()
	t.Cleanup(release)
	jstest.Eventually(t, jstest.Wait, "the view caught up", f.eng.RecordsCurrent)
	if !first("new", "t-b") {
		t.Fatal("a new session's first entry waits, with the view current")
	}
	// The later fact: an earlier version's turn takes session "held"
	// (Acquire reads the record, then writes it), and a first entry of
	// that session, once the view has the record, reads it and waits.
	sessionBatch(t, f, "held", "t-old", schemas.BatchRunning)
	if active, err := f.eng.Acquire(ctx(t), batch.Session{ID: "held", Key: key("held")}, "t-old", 0, nil); err != nil || !active {
		t.Fatalf("the earlier version's turn takes its session: %v %v", active, err)
	}
	jstest.Eventually(t, jstest.Wait, "the view has the held session's record", func() bool { return f.eng.RecordKnown(key("held")) })
	if first("held", "t-c") {
		t.Fatal("a first entry ran while an earlier version's turn holds its session")
	}
	for _, want := range []string{key("held"), key("held")} {
		if k := nextGet(); k != want {
			t.Fatalf("read %s's record; want %s's (Acquire's, then the first entry's): the new session's first entry read its record", k, want)
		}
	}

	// Released, the view is not current and first entries read again.
	release()
	if f.eng.RecordsCurrent() {
		t.Fatal("the view is current after its last follower released it")
	}
	if !first("after", "t-d") {
		t.Fatal("a new session's first entry waits after the view was released")
	}
	if k := nextGet(); k != key("after") {
		t.Fatalf("read %s; want the session's record read once the view is released", k)
	}
}
