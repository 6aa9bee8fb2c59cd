package executor_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const orderPolicy = `{
  "version": "order-1",
  "default_approval": "deny",
  "tools": {"count": {"approval": "never"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// orderFixture plays the transport and an earlier version's ingest: it
// stores inbound messages (for their arrival sequence) and publishes the
// accepted turns ingest would make of them on the accepted subject, in
// whatever order a test wants, to an executor (with the redriver) that
// must still run them in arrival order: it appends each to its session's
// order only once every earlier inbound message of the session is
// settled.
type orderFixture struct {
	h     *pt.H
	count *pt.Counter
}

func newOrderFixture(t *testing.T, o pt.Options) *orderFixture {
	count := &pt.Counter{}
	o.Policy, o.Tools = orderPolicy, []tools.Tool{count}
	o.Stages = []string{pt.Executor, pt.Redriver}
	return &orderFixture{h: pt.Start(t, o), count: count}
}

// arrive stores m on its inbound subject and returns its stream sequence.
func (f *orderFixture) arrive(m *schemas.InboundMessage) uint64 {
	f.h.T.Helper()
	return f.h.Publish(topology.InboundSubject(m.Transport, m.SessionID), m.Transport+":"+m.MessageID, m)
}

// accept publishes the accepted turn of m, which arrived at seq.
func (f *orderFixture) accept(m *schemas.InboundMessage, seq uint64) string {
	f.h.T.Helper()
	at, err := ingest.Accept(m, f.h.Policy, schemas.Provenance{StreamSeq: seq, ReceivedAt: time.Now().UTC(), IngestedBy: "test"})
	if err != nil {
		f.h.T.Fatal(err)
	}
	if err := f.h.Keys.Seal(at.Context); err != nil {
		f.h.T.Fatal(err)
	}
	f.h.Publish(topology.AcceptedSubject(schemas.SessionKey("cli", m.SessionID)), at.TurnID, at)
	return at.TurnID
}

// ran is the order in which turns' calls ran.
func (f *orderFixture) ran() []string {
	var turns []string
	for _, c := range f.count.Calls() {
		turns = append(turns, c.Context.TurnID)
	}
	return turns
}

func TestSessionTurnsRunInArrivalOrderWhateverOrderTheyAreAcceptedIn(t *testing.T) {
	f := newOrderFixture(t, pt.Options{})
	h := f.h
	const session = "ordered"
	var msgs []*schemas.InboundMessage
	var seqs []uint64
	for i := range 3 {
		m := h.Inbound(session, "alice", pt.Call("count", fmt.Sprintf(`{"n":%d}`, i)))
		msgs = append(msgs, m)
		seqs = append(seqs, f.arrive(m))
		// Another session's message in between, as under load.
		f.arrive(h.Inbound("other", "bob", pt.Call("count", `{}`)))
	}

	// The later turns are accepted first (two ingest replicas, or a NAK
	// and redelivery): they must wait for the first.
	t3 := f.accept(msgs[2], seqs[2])
	t2 := f.accept(msgs[1], seqs[1])
	jstest.Eventually(t, jstest.Wait, "the executor holds back both later turns at least once", func() bool {
		return h.Metric("tollgate_messages_retried_total", map[string]string{"stage": pt.Executor}) >= 2
	})
	if n := f.count.Total(); n != 0 {
		t.Fatalf("%d calls ran before the session's first turn was even accepted: %v", n, f.ran())
	}
	if order := h.Order(session); len(order) != 0 {
		t.Fatalf("the session's order holds %v before its first turn was accepted, want nothing", order)
	}

	t1 := f.accept(msgs[0], seqs[0])
	for _, turn := range []string{t1, t2, t3} {
		if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
			t.Fatalf("turn %s ended %s", turn, b.State)
		}
	}
	if got, want := f.ran(), []string{t1, t2, t3}; !slices.Equal(got, want) {
		t.Fatalf("calls ran in order %v, want arrival order %v", got, want)
	}
	if got, want := h.Order(session), []string{t1, t2, t3}; !slices.Equal(got, want) {
		t.Fatalf("the session's order is %v, want arrival order %v", got, want)
	}
	if !h.SessionFree(session) {
		t.Fatal("the session is not free after its last turn ended")
	}
}

func TestSessionOrderDoesNotWaitForMessagesThatCanNeverBeTurns(t *testing.T) {
	tests := []struct {
		name    string
		earlier func(f *orderFixture, session string) uint64
	}{
		{"bytes that are not msgpack", func(f *orderFixture, session string) uint64 {
			return f.h.PublishRaw(topology.InboundSubject("cli", session), f.h.NextID("junk"), []byte("not msgpack"), nil)
		}},
		{"a message ingest rejects (arguments that are not JSON)", func(f *orderFixture, session string) uint64 {
			m := f.h.Inbound(session, "alice", pt.Call("count", `{oops`))
			m.V = schemas.InboundVersion
			data, err := msgpack.Marshal(m)
			if err != nil {
				f.h.T.Fatal(err)
			}
			if _, err := schemas.Decode[schemas.InboundMessage](data); err != nil {
				f.h.T.Fatalf("the message must decode, so that only ingest's own checks reject it: %v", err)
			}
			return f.h.PublishRaw(topology.InboundSubject("cli", session), "cli:"+m.MessageID, data, nil)
		}},
		{"a message for this session published under another session's key", func(f *orderFixture, session string) uint64 {
			m := f.h.Inbound("someone-else", "alice", pt.Call("count", `{}`))
			return f.h.Publish(topology.InboundSubject("cli", session), "cli:"+m.MessageID, m)
		}},
		{"an earlier delivery of the same transport message", nil},
	}
	f := newOrderFixture(t, pt.Options{})
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := f.h.For(t)
			session := fmt.Sprintf("never-a-turn-%d", i)
			m := h.Inbound(session, "alice", pt.Call("count", `{}`))
			var seq uint64
			if tc.earlier != nil {
				tc.earlier(&orderFixture{h: h, count: f.count}, session)
				seq = (&orderFixture{h: h}).arrive(m)
			} else {
				// Two copies under different Nats-Msg-Ids; ingest made the
				// turn from the second.
				data, err := schemas.Encode(m)
				if err != nil {
					t.Fatal(err)
				}
				h.PublishRaw(topology.InboundSubject("cli", session), "copy-1", data, nil)
				seq = h.PublishRaw(topology.InboundSubject("cli", session), "copy-2", data, nil)
			}
			turn := (&orderFixture{h: h}).accept(m, seq)
			if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
				t.Fatalf("turn ended %s", b.State)
			}
			if got := h.Order(session); !slices.Equal(got, []string{turn}) {
				t.Fatalf("the session's order is %v, want the one turn %s", got, turn)
			}
		})
	}
	if n := f.h.Metric("tollgate_session_order_skipped_total", nil); n != 0 {
		t.Fatalf("%v earlier messages were skipped by timeout; none should have needed it", n)
	}
}

func TestSessionOrderStopsWaitingForAMessageThatNeverBecomesATurn(t *testing.T) {
	f := newOrderFixture(t, pt.Options{OrderWait: 500 * time.Millisecond})
	h := f.h
	const session = "stuck-earlier"
	lost := h.Inbound(session, "alice", pt.Call("count", `{}`))
	f.arrive(lost) // valid, but ingest never accepts it (it gave up on it)
	m := h.Inbound(session, "alice", pt.Call("count", `{}`))
	turn := f.accept(m, f.arrive(m))
	if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
		t.Fatalf("turn ended %s", b.State)
	}
	if n := h.Metric("tollgate_session_order_skipped_total", nil); n != 1 {
		t.Fatalf("skipped counter %v, want 1", n)
	}
	if b := h.Batch(schemas.TurnID("cli", lost.MessageID)); b != nil {
		t.Fatalf("the lost message became a batch: %+v", b)
	}
}

// TestAnEntryWaitsForTheTurnItNamesInItsSessionsOrder: a turn that came
// as an entry of its session's order runs once the turn before it has
// ended. While that turn has not (here: not yet due, so not even
// recorded), the later entry waits, queued at its place; the first one's
// end announces it, and both run, in order.
func TestAnEntryWaitsForTheTurnItNamesInItsSessionsOrder(t *testing.T) {
	f := newOrderFixture(t, pt.Options{})
	h := f.h
	const session = "entries"
	key := schemas.SessionKey("cli", session)
	w, err := turnorder.New(jstest.Ctx(t), h.JS)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(m *schemas.InboundMessage, seq uint64, notBefore time.Time) string {
		t.Helper()
		at, err := ingest.Accept(m, h.Policy, schemas.Provenance{StreamSeq: seq, ReceivedAt: time.Now().UTC(), IngestedBy: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Keys.Seal(at.Context); err != nil {
			t.Fatal(err)
		}
		at.NotBefore = notBefore
		data, err := schemas.Encode(at)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(jstest.Ctx(t), turnorder.Append{Kind: topology.OrderExec, Key: key, Turn: at.TurnID, Arrival: seq, Data: data}); err != nil {
			t.Fatal(err)
		}
		return at.TurnID
	}
	m1, m2 := h.Inbound(session, "alice", pt.Call("count", `{"n":1}`)), h.Inbound(session, "alice", pt.Call("count", `{"n":2}`))
	s1 := f.arrive(m1)
	f.arrive(h.Inbound("other", "bob", pt.Call("count", `{}`)))
	s2 := f.arrive(m2)
	t1 := entry(m1, s1, time.Now().Add(1500*time.Millisecond)) // not due yet: unsettled for a while
	t2 := entry(m2, s2, time.Time{})
	b2 := h.WaitBatch(t2, "the second entry waits behind the first", func(b *schemas.BatchRecord) bool {
		return b.State == schemas.BatchQueued
	})
	if b2.OrderAfter != t1 || b2.OrderSeq == 0 {
		t.Fatalf("the second entry's place is %d after %q, want after %s", b2.OrderSeq, b2.OrderAfter, t1)
	}
	if n := f.count.Total(); n != 0 {
		t.Fatalf("%d calls ran before the first entry was due: %v", n, f.ran())
	}
	for _, turn := range []string{t1, t2} {
		if b, _ := h.WaitTerminal(turn); b.State != schemas.BatchCompleted {
			t.Fatalf("turn %s ended %s", turn, b.State)
		}
	}
	if got, want := f.ran(), []string{t1, t2}; !slices.Equal(got, want) {
		t.Fatalf("calls ran in order %v, want the order's %v", got, want)
	}
}
