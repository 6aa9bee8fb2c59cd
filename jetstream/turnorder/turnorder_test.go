package turnorder

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

func newWriter(t testing.TB, js jetstream.JetStream, opts ...Option) *Writer {
	t.Helper()
	w, err := New(jstest.Ctx(t), js, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func mustAppend(t testing.TB, w *Writer, a Append) *Entry {
	t.Helper()
	e, err := w.Append(jstest.Ctx(t), a)
	if err != nil {
		t.Fatalf("append %s to %s: %v", a.Turn, a.Key, err)
	}
	return e
}

// entries reads every entry of session key's order, in stream order, each
// as Stamp reads it from the stored message.
func entries(t testing.TB, js jetstream.JetStream, key string) []*Entry {
	t.Helper()
	ctx := jstest.Ctx(t)
	s, err := js.Stream(ctx, topology.StreamTurns)
	if err != nil {
		t.Fatal(err)
	}
	var out []*Entry
	for seq := uint64(1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(topology.OrderWildcard(key)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		e, err := entryOf(m)
		if err != nil {
			t.Fatalf("entry at %d: %v", m.Sequence, err)
		}
		out = append(out, e)
		seq = m.Sequence + 1
	}
}

// checkLine fails unless es is one line: each entry names the one before
// it, by turn and by sequence, and the first names none.
func checkLine(t testing.TB, es []*Entry) {
	t.Helper()
	for i, e := range es {
		var want Entry
		if i > 0 {
			want = Entry{After: es[i-1].Turn, AfterSeq: es[i-1].Seq}
		}
		if e.After != want.After || e.AfterSeq != want.AfterSeq {
			t.Fatalf("entry %d (%s at %d) names %q at %d before it, want %q at %d", i, e.Turn, e.Seq, e.After, e.AfterSeq, want.After, want.AfterSeq)
		}
	}
}

func TestEachEntryNamesTheOneBeforeIt(t *testing.T) {
	env := jstest.Start(t)
	w := newWriter(t, env.JS)
	a := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k1", Turn: "t-1", Arrival: 5, Data: []byte("one")})
	mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k2", Turn: "u-1", Arrival: 6, Data: []byte("other session")})
	b := mustAppend(t, w, Append{Kind: topology.OrderPlan, Key: "k1", Turn: "t-2", Data: []byte("a follow-up: not ordered by arrival")})
	c := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k1", Turn: "t-3", Arrival: 9, Data: []byte("three")})
	if a.After != "" || a.AfterSeq != 0 || b.After != "t-1" || b.AfterSeq != a.Seq || c.After != "t-2" || c.AfterSeq != b.Seq {
		t.Fatalf("appends answered %+v, %+v, %+v: want a line t-1, t-2, t-3", a, b, c)
	}

	got := entries(t, env.JS, "k1")
	checkLine(t, got)
	var turns, kinds, data []string
	var arrivals []uint64
	for _, e := range got {
		turns, kinds, data, arrivals = append(turns, e.Turn), append(kinds, e.Kind), append(data, string(e.Data)), append(arrivals, e.Arrival)
	}
	if !slices.Equal(turns, []string{"t-1", "t-2", "t-3"}) || !slices.Equal(kinds, []string{"exec", "plan", "exec"}) ||
		!slices.Equal(data, []string{"one", "a follow-up: not ordered by arrival", "three"}) {
		t.Fatalf("session k1's order is %v %v %v", turns, kinds, data)
	}
	if !slices.Equal(arrivals, []uint64{5, 5, 9}) {
		t.Fatalf("arrival watermarks %v, want 5 5 9 (a follow-up keeps the session's)", arrivals)
	}
	if other := entries(t, env.JS, "k2"); len(other) != 1 || other[0].After != "" || other[0].Turn != "u-1" {
		t.Fatalf("session k2's order is %+v: another session's appends must not touch it", other)
	}
	last, err := w.Last(jstest.Ctx(t), "k1")
	if err != nil || last.Turn != "t-3" || last.Seq != c.Seq || last.Arrival != 9 {
		t.Fatalf("Last(k1) = %+v, %v; want t-3 at %d", last, err, c.Seq)
	}
	if _, err := w.Last(jstest.Ctx(t), "k3"); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Last of a session with no entry: %v, want ErrEmpty", err)
	}

	// Next walks the session's line, passing over another session's
	// entries, and finds none after the last.
	for _, tc := range []struct {
		after uint64
		want  *Entry // nil: ErrEmpty
	}{{0, a}, {a.Seq, b}, {b.Seq - 1, b}, {b.Seq, c}, {c.Seq, nil}} {
		e, err := w.Next(jstest.Ctx(t), "k1", tc.after)
		switch {
		case tc.want == nil && !errors.Is(err, ErrEmpty):
			t.Fatalf("Next(k1, %d) = %+v, %v; want ErrEmpty", tc.after, e, err)
		case tc.want != nil && (err != nil || e.Turn != tc.want.Turn || e.Seq != tc.want.Seq || e.After != tc.want.After || string(e.Data) != string(tc.want.Data)):
			t.Fatalf("Next(k1, %d) = %+v, %v; want %s at %d", tc.after, e, err, tc.want.Turn, tc.want.Seq)
		}
	}
	if _, err := w.Next(jstest.Ctx(t), "k 1", 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Next of an invalid session key: %v, want ErrInvalid", err)
	}
}

func TestConcurrentWritersAppendOneLine(t *testing.T) {
	env := jstest.Start(t)
	const writers, each = 4, 15
	var wg sync.WaitGroup
	ws := make([]*Writer, writers)
	errs := make(chan error, writers*each)
	for i := range ws {
		ws[i] = newWriter(t, env.JS)
	}
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				turn := fmt.Sprintf("t-%d-%d", i, j)
				if _, err := w.Append(jstest.Ctx(t), Append{Kind: topology.OrderExec, Key: "k", Turn: turn, Arrival: uint64(1 + i*each + j)}); err != nil {
					errs <- fmt.Errorf("%s: %w", turn, err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got := entries(t, env.JS, "k")
	checkLine(t, got)
	seen := map[string]int{}
	var watermark uint64
	for _, e := range got {
		seen[e.Turn]++
		if e.Arrival < watermark {
			t.Fatalf("watermark fell from %d to %d at %s", watermark, e.Arrival, e.Turn)
		}
		watermark = e.Arrival
	}
	if len(got) != writers*each || len(seen) != writers*each {
		t.Fatalf("%d entries of %d turns, want each of %d turns once", len(got), len(seen), writers*each)
	}
	var conflicts int64
	for _, w := range ws {
		conflicts += w.Stats().Conflicts
	}
	t.Logf("%d appends made again after another writer's", conflicts)
}

func TestAStaleMemoryCostsOneRefusal(t *testing.T) {
	env := jstest.Start(t)
	a, b := newWriter(t, env.JS), newWriter(t, env.JS)
	mustAppend(t, a, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1"})
	mustAppend(t, b, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-2"})
	e := mustAppend(t, a, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-3"}) // a remembers t-1 as the last
	if e.After != "t-2" {
		t.Fatalf("t-3 follows %q, want t-2 (the last entry, which writer a did not write)", e.After)
	}
	if s := a.Stats(); s.Conflicts != 1 || s.Own != 0 {
		t.Fatalf("writer a's stats %+v, want one conflict", s)
	}
	checkLine(t, entries(t, env.JS, "k"))
}

// lostAck publishes a message and then reports that no acknowledgement
// came, the first n times.
func lostAck(js jetstream.JetStream, n int32) func(context.Context, *nats.Msg) (*jetstream.PubAck, error) {
	var lost atomic.Int32
	return func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
		ack, err := js.PublishMsg(ctx, m)
		if err == nil && lost.Add(1) <= n {
			return nil, nats.ErrTimeout
		}
		return ack, err
	}
}

func TestAnAppendWhoseAcknowledgementWasLostIsStoredOnce(t *testing.T) {
	t.Run("read back as the last entry", func(t *testing.T) {
		env := jstest.Start(t)
		w := newWriter(t, env.JS, withPublish(lostAck(env.JS, 1)))
		mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1"})
		e := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-2"})
		got := entries(t, env.JS, "k")
		if len(got) != 2 || got[1].Turn != "t-2" || e.Seq != got[1].Seq || e.After != "t-1" {
			t.Fatalf("entries %+v, answer %+v: want t-2 once, after t-1", got, e)
		}
		if s := w.Stats(); s.Retries != 1 || s.Own != 1 {
			t.Fatalf("stats %+v, want one retry recognised as the writer's own", s)
		}
	})
	t.Run("made again after another writer appended behind it", func(t *testing.T) {
		env := jstest.Start(t)
		// The first attempt of t-1 is stored, its answer lost, and the
		// stage gives up (one attempt); another writer appends t-2; the
		// stage makes t-1's append again, knowing only the empty session.
		w := newWriter(t, env.JS, withPublish(lostAck(env.JS, 1)), WithAttempts(1, jstest.Scale(DefaultAttemptTimeout)), WithRemembered(0))
		if _, err := w.Append(jstest.Ctx(t), Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1", Arrival: 3}); err == nil {
			t.Fatal("an append whose only attempt got no answer succeeded")
		}
		mustAppend(t, newWriter(t, env.JS), Append{Kind: topology.OrderExec, Key: "k", Turn: "t-2", Arrival: 4})
		e := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1", Arrival: 3})
		got := entries(t, env.JS, "k")
		if len(got) != 2 || got[0].Turn != "t-1" || got[1].Turn != "t-2" {
			t.Fatalf("entries %+v: want t-1 once, then t-2", got)
		}
		if e.Seq != got[0].Seq || e.After != "" || e.Arrival != 3 {
			t.Fatalf("the repeated append answered %+v, want t-1's stored entry at %d", e, got[0].Seq)
		}
		checkLine(t, got)
	})
}

// TestARepeatRaisesTheWatermarkOncePerDelivery: a turn appended again for a
// later delivery of its message is one more entry, once however often that
// delivery is appended.
func TestARepeatRaisesTheWatermarkOncePerDelivery(t *testing.T) {
	env := jstest.Start(t)
	w := newWriter(t, env.JS)
	mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1", Arrival: 4})
	if e := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1", Arrival: 6}); e.Arrival != 4 {
		t.Fatalf("a second delivery's append answered %+v: want the turn's stored entry (watermark 4)", e)
	}
	for range 2 {
		if e := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1", Arrival: 6, Repeat: true}); e.Arrival != 6 || e.MsgID != "order:t-1:6" {
			t.Fatalf("the repeat answered %+v", e)
		}
	}
	got := entries(t, env.JS, "k")
	if len(got) != 2 || got[1].Turn != "t-1" || got[1].Arrival != 6 {
		t.Fatalf("entries %+v: want t-1, then its repeat once, at watermark 6", got)
	}
	checkLine(t, got)
	if _, err := w.Append(jstest.Ctx(t), Append{Kind: topology.OrderExec, Key: "k", Turn: "t-1", Repeat: true}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a repeat without its arrival: %v, want ErrInvalid", err)
	}
}

func TestInvalidAppendsAreRefusedBeforeAnyWrite(t *testing.T) {
	env := jstest.Start(t)
	w := newWriter(t, env.JS)
	for _, a := range []Append{
		{Kind: "run", Key: "k", Turn: "t-1"},
		{Kind: topology.OrderExec, Key: "a.b", Turn: "t-1"},
		{Kind: topology.OrderExec, Key: "k", Turn: "t>1"},
		{Kind: topology.OrderExec, Key: "", Turn: "t-1"},
	} {
		if _, err := w.Append(jstest.Ctx(t), a); !errors.Is(err, ErrInvalid) {
			t.Errorf("Append(%+v) = %v, want ErrInvalid", a, err)
		}
	}
	if _, err := w.Last(jstest.Ctx(t), "k.*"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Last of a wildcard: %v, want ErrInvalid", err)
	}
	if got := entries(t, env.JS, "k"); len(got) != 0 {
		t.Fatalf("refused appends stored %d entries", len(got))
	}
}

func TestStampRefusesWhatNoAppendWrites(t *testing.T) {
	subject := topology.OrderSubject(topology.OrderExec, "k")
	hdr := func(kv ...string) nats.Header {
		h := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	id := jetstream.MsgIDHeader
	for _, tc := range []struct {
		name    string
		subject string
		hdr     nats.Header
		want    *Entry
	}{
		{"a session's first entry", subject, hdr(id, "order:t-1", topology.HeaderOrderArrival, "4"),
			&Entry{Kind: "exec", Key: "k", Turn: "t-1", MsgID: "order:t-1", Arrival: 4}},
		{"an entry after another", subject, hdr(id, "order:t-2", topology.HeaderOrderAfter, "t-1", jetstream.ExpectedLastSubjSeqHeader, "7"),
			&Entry{Kind: "exec", Key: "k", Turn: "t-2", MsgID: "order:t-2", After: "t-1", AfterSeq: 7}},
		{"another subject", topology.AcceptedSubject("k"), hdr(id, "order:t-1"), nil},
		{"a repeated entry", subject, hdr(id, "order:t-1:9", topology.HeaderOrderAfter, "t-1", jetstream.ExpectedLastSubjSeqHeader, "7", topology.HeaderOrderArrival, "9"),
			&Entry{Kind: "exec", Key: "k", Turn: "t-1", MsgID: "order:t-1:9", After: "t-1", AfterSeq: 7, Arrival: 9}},
		{"a message id of another kind", subject, hdr(id, "t-1"), nil},
		{"a repeat without its arrival", subject, hdr(id, "order:t-1:"), nil},
		{"no message id", subject, hdr(), nil},
		{"a turn before it that is no turn id", subject, hdr(id, "order:t-2", topology.HeaderOrderAfter, "t.1", jetstream.ExpectedLastSubjSeqHeader, "7"), nil},
		{"a turn before it without its sequence", subject, hdr(id, "order:t-2", topology.HeaderOrderAfter, "t-1"), nil},
		{"a sequence without its turn", subject, hdr(id, "order:t-2", jetstream.ExpectedLastSubjSeqHeader, "7"), nil},
		{"a watermark that is no number", subject, hdr(id, "order:t-2", topology.HeaderOrderArrival, "-1"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Stamp(tc.subject, tc.hdr)
			if tc.want == nil {
				if schemas.CodeOf(err) != schemas.CodeMalformed {
					t.Fatalf("Stamp = %+v, %v; want MALFORMED", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Stamp = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func FuzzStamp(f *testing.F) {
	f.Add("tollgate.turn.order.exec.k", "order:t-1", "", "", "")
	f.Add("tollgate.turn.order.plan.k", "order:t-2", "t-1", "7", "9")
	f.Add("tollgate.turn.order.exec.k", "order:t-2", "t-1", "x", "")
	f.Add("tollgate.turn.order.exec.k", "order:t-2:12", "t-1", "7", "12")
	f.Fuzz(func(t *testing.T, subject, msgID, after, afterSeq, arrival string) {
		h := nats.Header{}
		for k, v := range map[string]string{jetstream.MsgIDHeader: msgID, topology.HeaderOrderAfter: after,
			jetstream.ExpectedLastSubjSeqHeader: afterSeq, topology.HeaderOrderArrival: arrival} {
			if v != "" {
				h.Set(k, v)
			}
		}
		e, err := Stamp(subject, h)
		if err != nil {
			if schemas.CodeOf(err) != schemas.CodeMalformed {
				t.Fatalf("Stamp failed without MALFORMED: %v", err)
			}
			return
		}
		if !schemas.ValidKey(e.Key) || !schemas.ValidKey(e.Turn) || (e.After == "") != (e.AfterSeq == 0) || (e.After != "" && !schemas.ValidKey(e.After)) {
			t.Fatalf("Stamp accepted %+v", e)
		}
		turn, delivery, _ := topology.ParseOrderMsgID(msgID)
		want := topology.OrderMsgID(turn)
		if delivery != 0 {
			want = topology.OrderRepeatMsgID(turn, delivery)
		}
		if topology.OrderSubject(e.Kind, e.Key) != subject || e.Turn != turn || want != msgID {
			t.Fatalf("Stamp read %+v from %s, %s", e, subject, msgID)
		}
	})
}

func TestAnEntryPlacesItsTurnUnlessItIsARepeat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		e     *Entry
		seq   uint64
		after string
	}{
		{"a first entry", &Entry{Turn: "t-1", Seq: 4, MsgID: topology.OrderMsgID("t-1")}, 4, ""},
		{"an entry after another", &Entry{Turn: "t-2", Seq: 9, After: "t-1", AfterSeq: 4, MsgID: topology.OrderMsgID("t-2")}, 9, "t-1"},
		{"a repeated entry", &Entry{Turn: "t-1", Seq: 12, After: "t-2", AfterSeq: 9, MsgID: topology.OrderRepeatMsgID("t-1", 30)}, 0, ""},
		{"no entry", nil, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if seq, after := tc.e.Place(); seq != tc.seq || after != tc.after {
				t.Fatalf("Place() = %d, %q; want %d, %q", seq, after, tc.seq, tc.after)
			}
		})
	}
}

// TestANewSessionsOrderIsReadOnce: ingest reads a session's watermark and
// then appends; for a session with no entry the append follows that one
// read (a message get on TOLLGATE_TURNS) without a second. A memory of the
// empty session made stale by another writer is refused and read again,
// like any other.
func TestANewSessionsOrderIsReadOnce(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	// A read of the order is a message get, or a direct get where the
	// stream allows them (one replica: the request's subject may name the
	// filter): all come on one channel, in order.
	gets := make(chan *nats.Msg, 64)
	for _, subj := range []string{"$JS.API.STREAM.MSG.GET." + topology.StreamTurns,
		"$JS.API.DIRECT.GET." + topology.StreamTurns, "$JS.API.DIRECT.GET." + topology.StreamTurns + ".>"} {
		if _, err := env.NC.ChanSubscribe(subj, gets); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	w := newWriter(t, env.JS)
	if wm, err := w.Watermark(ctx, "new"); err != nil || wm != 0 {
		t.Fatalf("a new session's watermark: %d, %v; want 0", wm, err)
	}
	e := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "new", Turn: "t-1", Arrival: 5})
	if e.After != "" || e.Arrival != 5 {
		t.Fatalf("the first entry %+v: want none before it, watermark 5", e)
	}
	// The later fact: another new session's read, made after the append.
	if _, err := w.Watermark(ctx, "later"); err != nil {
		t.Fatal(err)
	}
	var before []string
	for later := false; !later; {
		select {
		case m := <-gets:
			read := m.Subject + " " + string(m.Data)
			if later = strings.Contains(read, topology.OrderWildcard("later")); !later {
				before = append(before, read)
			}
		case <-time.After(jstest.Wait):
			t.Fatalf("the later session's read never came (reads before it: %q)", before)
		}
	}
	if len(before) != 1 {
		t.Fatalf("the new session's order was read %d times: %q; want once (its watermark), the append reading nothing", len(before), before)
	}

	// Stale: writer a finds the session empty, b appends, a appends.
	a, b := newWriter(t, env.JS), newWriter(t, env.JS)
	if _, err := a.Watermark(ctx, "raced"); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, b, Append{Kind: topology.OrderExec, Key: "raced", Turn: "t-2"})
	if e := mustAppend(t, a, Append{Kind: topology.OrderExec, Key: "raced", Turn: "t-3"}); e.After != "t-2" {
		t.Fatalf("t-3 follows %q, want t-2 (appended after writer a found the session empty)", e.After)
	}
	if s := a.Stats(); s.Conflicts != 1 {
		t.Fatalf("writer a's stats %+v, want the one refusal of its stale memory", s)
	}
	checkLine(t, entries(t, env.JS, "raced"))
}

// TestAnAssumptionNeverReplacesWhatTheWriterRemembers: AssumeNew makes a
// session the Writer knows nothing of known as empty (Known: watermark 0),
// and leaves a remembered session's last entry as it is, so the next
// append still follows that entry without a refusal. A wrong assumption is
// refused once and the append follows the real last entry.
func TestAnAssumptionNeverReplacesWhatTheWriterRemembers(t *testing.T) {
	env := jstest.Start(t)
	w := newWriter(t, env.JS)
	if _, ok := w.Known("assumed"); ok {
		t.Fatal("a session never seen is known")
	}
	w.AssumeNew("assumed")
	if wm, ok := w.Known("assumed"); !ok || wm != 0 {
		t.Fatalf("an assumed session: watermark %d, known %v; want 0, true", wm, ok)
	}
	mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "kept", Turn: "t-1", Arrival: 7})
	w.AssumeNew("kept")
	if wm, ok := w.Known("kept"); !ok || wm != 7 {
		t.Fatalf("a remembered session after AssumeNew: watermark %d, known %v; want 7, true", wm, ok)
	}
	if e := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "kept", Turn: "t-2", Arrival: 9}); e.After != "t-1" || e.Arrival != 9 {
		t.Fatalf("t-2 after %q with watermark %d, want after t-1 with 9", e.After, e.Arrival)
	}
	other := newWriter(t, env.JS)
	mustAppend(t, other, Append{Kind: topology.OrderExec, Key: "wrong", Turn: "t-3", Arrival: 4})
	w.AssumeNew("wrong")
	if e := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "wrong", Turn: "t-4", Arrival: 5}); e.After != "t-3" {
		t.Fatalf("t-4 follows %q, want t-3 (the entry the assumption missed)", e.After)
	}
	if s := w.Stats(); s.Conflicts != 1 {
		t.Fatalf("stats %+v, want the one refusal of the wrong assumption", s)
	}
	checkLine(t, entries(t, env.JS, "wrong"))
}

// TestTheWriterRemembersAPlaceNotATurn: the entry an append returns
// carries the turn it stored, and the Writer's memory of the session
// keeps only the place the next append names (a Writer remembers
// DefaultRemembered sessions; their turns would stay live for the
// collector to scan), and the next append, made from that memory without
// a read, still names the entry before it.
func TestTheWriterRemembersAPlaceNotATurn(t *testing.T) {
	env := jstest.Start(t)
	w := newWriter(t, env.JS)
	a := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k1", Turn: "t-1", Arrival: 5, Data: []byte("the turn"),
		Header: nats.Header{"Traceparent": []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}})
	if string(a.Data) != "the turn" || a.Header.Get("Traceparent") == "" {
		t.Fatalf("the append answered %+v: want its turn and headers", a)
	}
	m := w.lasts.get("k1")
	if m == nil || m.Data != nil || m.Header != nil {
		t.Fatalf("the Writer remembers %+v: want the place without the turn or headers", m)
	}
	if m.Turn != "t-1" || m.Seq != a.Seq || m.Arrival != 5 {
		t.Fatalf("the Writer remembers %+v: want t-1 at %d, watermark 5", m, a.Seq)
	}
	b := mustAppend(t, w, Append{Kind: topology.OrderExec, Key: "k1", Turn: "t-2", Arrival: 7, Data: []byte("next")})
	if b.After != "t-1" || b.AfterSeq != a.Seq || w.conflicts.Load() != 0 {
		t.Fatalf("the next append named %q at %d after %d refusals: want t-1 at %d, none refused", b.After, b.AfterSeq, w.conflicts.Load(), a.Seq)
	}
	checkLine(t, entries(t, env.JS, "k1"))
}
