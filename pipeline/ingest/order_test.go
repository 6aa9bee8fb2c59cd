package ingest_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/sessionorder"
	"github.com/tollgate-dev/tollgate/schemas"
)

// orderIngest is an ingest stage driven by hand: the test hands it inbound
// messages in the order it chooses (two replicas, or a redelivery, would
// take them so), with its clock.
type orderIngest struct {
	h   *pt.H
	in  *ingest.Ingest
	reg *prometheus.Registry
	now time.Time
}

func newOrderIngest(t *testing.T) *orderIngest {
	h := pt.Start(t, pt.Options{Policy: ingestPolicy, Stages: []string{pt.Executor, pt.Redriver}})
	o := &orderIngest{h: h, reg: prometheus.NewRegistry(), now: time.Now()}
	in, err := ingest.New(ingest.Config{JS: h.JS, Policy: h.Policy, Keys: h.Keys, Logger: slog.New(slog.DiscardHandler),
		Metrics: runner.NewMetrics(o.reg), Instance: "ingest@order-test", Registerer: o.reg, OrderWait: time.Minute,
		Now: func() time.Time { return o.now }})
	if err != nil {
		t.Fatal(err)
	}
	o.in = in
	return o
}

// deliveries fetches every stored inbound message of session from a
// consumer of its own, as deliveries the stage's runner would hand over.
func (o *orderIngest) deliveries(session string) map[uint64]jetstream.Msg {
	o.h.T.Helper()
	ctx := jstest.Ctx(o.h.T)
	c, err := o.h.JS.OrderedConsumer(ctx, topology.StreamInbound, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{topology.InboundSubject("cli", session)}})
	if err != nil {
		o.h.T.Fatal(err)
	}
	out := map[uint64]jetstream.Msg{}
	batch, err := c.FetchNoWait(100)
	if err != nil {
		o.h.T.Fatal(err)
	}
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			o.h.T.Fatal(err)
		}
		out[md.Sequence.Stream] = m
	}
	return out
}

// order is the turns of session's order and their watermarks.
func (o *orderIngest) order(session string) (turns []string, arrivals []uint64) {
	o.h.T.Helper()
	for _, m := range o.h.Messages(topology.StreamTurns, topology.OrderWildcard(schemas.SessionKey("cli", session))) {
		e, err := turnorder.Stamp(m.Subject, m.Header)
		if err != nil {
			o.h.T.Fatal(err)
		}
		turns, arrivals = append(turns, e.Turn), append(arrivals, e.Arrival)
	}
	return turns, arrivals
}

func (o *orderIngest) handle(m jetstream.Msg) error { return o.in.Handle(jstest.Ctx(o.h.T), m) }

func waits(err error) bool {
	var w *sessionorder.OutOfOrder
	return errors.As(err, &w)
}

// TestIngestAppendsInArrivalOrderWhateverOrderItTakesMessagesIn: a later
// inbound message of a session taken first waits until every earlier one
// has joined the order or can never be a turn, so the order is the arrival
// order.
func TestIngestAppendsInArrivalOrderWhateverOrderItTakesMessagesIn(t *testing.T) {
	o := newOrderIngest(t)
	h := o.h
	const session = "arrivals"
	m1, m3 := h.Inbound(session, "alice", pt.Call("echo", `{"text":"1"}`)), h.Inbound(session, "alice", pt.Call("echo", `{"text":"3"}`))
	s1 := h.Send(m1)
	h.Send(h.Inbound("other", "bob", pt.Call("echo", `{"text":"between"}`)))
	junk := h.PublishRaw(topology.InboundSubject("cli", session), h.NextID("junk"), []byte("not msgpack"), nil)
	s3 := h.Send(m3)
	d := o.deliveries(session)
	if len(d) != 3 {
		t.Fatalf("%d inbound messages of the session stored, want 3", len(d))
	}
	seqs := slices.Sorted(func(yield func(uint64) bool) {
		for s := range d {
			if !yield(s) {
				return
			}
		}
	})
	first, last := d[seqs[0]], d[seqs[2]]

	if err := o.handle(last); !waits(err) {
		t.Fatalf("the third message taken first: %v, want it to wait for the first", err)
	}
	if turns, _ := o.order(session); len(turns) != 0 {
		t.Fatalf("the order holds %v before the session's first message joined", turns)
	}
	if err := o.handle(first); err != nil {
		t.Fatal(err)
	}
	// The message between is junk (never a turn): it holds nothing back.
	if err := o.handle(last); err != nil {
		t.Fatalf("the third message after the first: %v", err)
	}
	if err := o.handle(first); err != nil { // a redelivery: no second entry
		t.Fatal(err)
	}
	turns, arrivals := o.order(session)
	if !slices.Equal(turns, []string{s1, s3}) || !slices.Equal(arrivals, []uint64{seqs[0], seqs[2]}) {
		t.Fatalf("order %v (watermarks %v), want %v at %d, %d", turns, arrivals, []string{s1, s3}, seqs[0], seqs[2])
	}
	if junk != seqs[1] {
		t.Fatalf("the junk message is at %d, want between the two turns (%v)", junk, seqs)
	}
	if n := testMetric(t, o.reg, "tollgate_session_order_skipped_total"); n != 0 {
		t.Fatalf("%v messages skipped, want none", n)
	}
}

// TestIngestStopsWaitingForAMessageThatNeverJoins: a later message waits
// for an earlier one for the order wait only; then it joins, and the
// skip is counted.
func TestIngestStopsWaitingForAMessageThatNeverJoins(t *testing.T) {
	o := newOrderIngest(t)
	h := o.h
	const session = "stuck"
	warm := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"0"}`)))
	stuck := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"1"}`)))
	later := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"2"}`)))
	d := o.deliveries(session)
	var seqs []uint64
	for s := range d {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	if err := o.handle(d[seqs[0]]); err != nil {
		t.Fatal(err)
	}
	if err := o.handle(d[seqs[2]]); !waits(err) {
		t.Fatalf("a message behind one not yet in the order: %v, want it to wait", err)
	}
	o.now = o.now.Add(2 * time.Minute) // past the order wait
	if err := o.handle(d[seqs[2]]); err != nil {
		t.Fatalf("after the order wait: %v", err)
	}
	if turns, _ := o.order(session); !slices.Equal(turns, []string{warm, later}) {
		t.Fatalf("order %v, want %v then %v (%v passed over)", turns, warm, later, stuck)
	}
	if n := testMetric(t, o.reg, "tollgate_session_order_skipped_total"); n != 1 {
		t.Fatalf("%v messages skipped, want 1", n)
	}
}

func testMetric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return metrics.Sum(mfs, name, nil)
}

// readsUntil returns the reads on ch that name key (in the request's
// subject or body), up to the first that names marker: the later fact.
func readsUntil(t *testing.T, ch <-chan *nats.Msg, key, marker string) (turns, inbound []string) {
	t.Helper()
	for {
		select {
		case m := <-ch:
			read := m.Subject + " " + string(m.Data)
			switch {
			case strings.Contains(read, marker):
				return turns, inbound
			case !strings.Contains(read, key):
			case strings.Contains(m.Subject, topology.StreamTurns):
				turns = append(turns, read)
			default:
				inbound = append(inbound, read)
			}
		case <-time.After(jstest.Wait):
			t.Fatalf("the later read naming %s never came (reads of %s: %q, %q)", marker, key, turns, inbound)
		}
	}
}

// TestANewSessionsTurnReadsNoOrder: a turn whose inbound message is the
// first its session has in TOLLGATE_INBOUND joins the order without a read
// of the order: one lookup of the session's first inbound message, then
// the append, which assumes the order empty. Where that is wrong (the
// order has an entry of a turn whose inbound message the stream no longer
// keeps), the append's compare-and-set refuses it and the turn is placed
// after that entry; a session this ingest does not remember but whose
// earlier message is stored is read and checked as before.
func TestANewSessionsTurnReadsNoOrder(t *testing.T) {
	o := newOrderIngest(t)
	h := o.h
	ctx := jstest.Ctx(t)
	reads := h.Gets(topology.StreamTurns, topology.StreamInbound)
	later := func(marker string) {
		t.Helper()
		// The later fact: a read of a session nobody writes, made after.
		s, err := h.JS.Stream(ctx, topology.StreamTurns)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetLastMsgForSubject(ctx, topology.OrderWildcard(marker)); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("the marker read: %v, want not found", err)
		}
	}
	only := func(session string) jetstream.Msg {
		t.Helper()
		d := o.deliveries(session)
		if len(d) != 1 {
			t.Fatalf("%d inbound messages of %s, want 1", len(d), session)
		}
		for _, m := range d {
			return m
		}
		return nil
	}

	t.Run("a new session's turn reads its first inbound message and nothing of the order", func(t *testing.T) {
		const session = "fresh"
		turn := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"1"}`)))
		if err := o.handle(only(session)); err != nil {
			t.Fatal(err)
		}
		later("marker-fresh")
		turns, inbound := readsUntil(t, reads, schemas.SessionKey("cli", session), "marker-fresh")
		if len(turns) != 0 || len(inbound) != 1 {
			t.Fatalf("reads of the order %q and of the inbound stream %q; want none of the order, one of the inbound stream", turns, inbound)
		}
		if got, _ := o.order(session); !slices.Equal(got, []string{turn}) {
			t.Fatalf("order %v, want [%s]", got, turn)
		}
	})

	t.Run("an entry the assumption missed is placed before the turn", func(t *testing.T) {
		const session = "expired"
		key := schemas.SessionKey("cli", session)
		w, err := turnorder.New(ctx, h.JS)
		if err != nil {
			t.Fatal(err)
		}
		// An entry whose inbound message the stream does not keep (as
		// after TOLLGATE_INBOUND's max age).
		if _, err := w.Append(ctx, turnorder.Append{Kind: topology.OrderExec, Key: key, Turn: "cli-old-turn", Arrival: 1, Data: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		turn := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"2"}`)))
		if err := o.handle(only(session)); err != nil {
			t.Fatal(err)
		}
		got, _ := o.order(session)
		if !slices.Equal(got, []string{"cli-old-turn", turn}) {
			t.Fatalf("order %v, want the old entry, then %s after it", got, turn)
		}
		last, err := w.Last(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if last.Turn != turn || last.After != "cli-old-turn" {
			t.Fatalf("the turn's entry %s after %q, want %s after cli-old-turn", last.Turn, last.After, turn)
		}
	})

	t.Run("a session another ingest placed is read and checked", func(t *testing.T) {
		const session = "elsewhere"
		key := schemas.SessionKey("cli", session)
		first := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"a"}`)))
		if err := o.handle(only(session)); err != nil {
			t.Fatal(err)
		}
		second := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"b"}`)))
		d := o.deliveries(session)
		seqs := slices.Sorted(maps.Keys(d))
		// A second replica, which remembers nothing of the session.
		reg := prometheus.NewRegistry()
		in, err := ingest.New(ingest.Config{JS: h.JS, Policy: h.Policy, Keys: h.Keys, Logger: slog.New(slog.DiscardHandler),
			Metrics: runner.NewMetrics(reg), Instance: "ingest@other", Registerer: reg, OrderWait: time.Minute,
			Now: func() time.Time { return o.now }})
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Handle(ctx, d[seqs[len(seqs)-1]]); err != nil {
			t.Fatal(err)
		}
		later("marker-elsewhere")
		turns, _ := readsUntil(t, reads, key, "marker-elsewhere")
		if len(turns) == 0 {
			t.Fatalf("the second ingest placed the session's second turn without reading its order")
		}
		if got, _ := o.order(session); !slices.Equal(got, []string{first, second}) {
			t.Fatalf("order %v, want [%s %s]", got, first, second)
		}
	})
}

// TestTheOrderCheckStartsAtIngestsAckFloor: the check of a session's
// earlier inbound messages starts at the ingest consumer's acknowledgement
// floor where that is above the session's watermark: every message at or
// below it was acknowledged by ingest (joined the order, or never will), so
// the server need not walk the other sessions' messages stored between.
// A message ingest has taken and not acknowledged still holds its session;
// one it gave up on (terminated) holds it no longer, without the order
// wait. The test takes the messages from the ingest consumer itself and
// acknowledges each after the stage handles it, as the stage's runner does.
func TestTheOrderCheckStartsAtIngestsAckFloor(t *testing.T) {
	o := newOrderIngest(t)
	h := o.h
	ctx := jstest.Ctx(t)
	spec := topology.IngestConsumer()
	cfg := spec.Config
	cfg.AckWait = time.Hour // held messages stay held
	c, err := h.JS.CreateOrUpdateConsumer(ctx, spec.Stream, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// between is more than the shortest walk the gate reads a floor for (64).
	const between = 100
	others := func(t *testing.T, tag string) {
		t.Helper()
		for i := range between {
			h.Send(h.Inbound(fmt.Sprintf("%s-%d", tag, i), "bob", pt.Call("echo", `{"text":"x"}`)))
		}
	}
	take := func(t *testing.T, n int) []jetstream.Msg {
		t.Helper()
		b, err := c.Fetch(n, jetstream.FetchMaxWait(jstest.Wait))
		if err != nil {
			t.Fatal(err)
		}
		var out []jetstream.Msg
		for m := range b.Messages() {
			out = append(out, m)
		}
		if len(out) != n {
			t.Fatalf("took %d inbound messages, want %d", len(out), n)
		}
		return out
	}
	seqOf := func(t *testing.T, m jetstream.Msg) uint64 {
		t.Helper()
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		return md.Sequence.Stream
	}
	settle := func(t *testing.T, ms ...jetstream.Msg) {
		t.Helper()
		for _, m := range ms {
			if err := o.handle(m); err != nil {
				t.Fatalf("inbound message %d: %v", seqOf(t, m), err)
			}
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// floorAt waits until the consumer's floor is seq, then lets the
	// gate's cached floor age past its refresh.
	floorAt := func(t *testing.T, seq uint64) {
		t.Helper()
		jstest.EventuallyState(t, jstest.Wait, "the ingest consumer's ack floor", func() (bool, string) {
			info, err := c.Info(ctx)
			if err != nil {
				return false, err.Error()
			}
			return info.AckFloor.Stream == seq, fmt.Sprintf("floor %d, want %d", info.AckFloor.Stream, seq)
		})
		o.now = o.now.Add(time.Second)
	}
	// walks is where the check's reads of session's inbound messages
	// started (the get's sequence), up to a later read.
	walks := func(t *testing.T, reads <-chan *nats.Msg, session, marker string) []uint64 {
		t.Helper()
		s, err := h.JS.Stream(ctx, topology.StreamInbound)
		if err != nil {
			t.Fatal(err)
		}
		marker = topology.InboundSubject("cli", marker)
		if _, err := s.GetLastMsgForSubject(ctx, marker); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("the marker read: %v, want not found", err)
		}
		_, inbound := readsUntil(t, reads, topology.InboundSubject("cli", session), marker)
		var from []uint64
		for _, r := range inbound {
			var req struct {
				Seq uint64 `json:"seq"`
			}
			if err := json.Unmarshal([]byte(r[strings.Index(r, " ")+1:]), &req); err != nil {
				t.Fatalf("read %q: %v", r, err)
			}
			from = append(from, req.Seq)
		}
		return from
	}

	t.Run("the walk starts at the floor, not at the session's watermark", func(t *testing.T) {
		const session = "floor"
		first := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"1"}`)))
		others(t, "floor-other")
		second := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"2"}`)))
		ms := take(t, between+2)
		settle(t, ms[:1+between/2]...) // the first turn and half the others
		floorAt(t, seqOf(t, ms[between/2]))
		reads := h.Gets(topology.StreamInbound) // the executor reads the others' turns: not collected
		settle(t, ms[len(ms)-1])
		// The others' turns join too, whatever follows (their sessions are new: no walk).
		settle(t, ms[1+between/2:len(ms)-1]...)
		floorAt(t, seqOf(t, ms[len(ms)-1]))
		if from := walks(t, reads, session, "marker-floor"); !slices.Equal(from, []uint64{seqOf(t, ms[between/2]) + 1}) {
			t.Fatalf("the check read the session's messages from %v, want from %d (the floor, not the watermark %d)",
				from, seqOf(t, ms[between/2])+1, seqOf(t, ms[0]))
		}
		if got, _ := o.order(session); !slices.Equal(got, []string{first, second}) {
			t.Fatalf("order %v, want %v", got, []string{first, second})
		}
	})

	t.Run("a message ingest holds unacknowledged still holds its session", func(t *testing.T) {
		const session = "held"
		first := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"1"}`)))
		second := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"2"}`)))
		others(t, "held-other")
		third := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"3"}`)))
		ms := take(t, between+3)
		settle(t, ms[0]) // the second stays in another replica's hands
		settle(t, ms[2:2+between]...)
		if err := o.handle(ms[len(ms)-1]); !waits(err) {
			t.Fatalf("the third message while the second is taken and not acknowledged: %v, want it to wait", err)
		}
		settle(t, ms[1], ms[len(ms)-1])
		if got, _ := o.order(session); !slices.Equal(got, []string{first, second, third}) {
			t.Fatalf("order %v, want %v", got, []string{first, second, third})
		}
		floorAt(t, seqOf(t, ms[len(ms)-1]))
	})

	t.Run("a message ingest gave up on holds its session no longer", func(t *testing.T) {
		const session = "given-up"
		h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"1"}`)))
		others(t, "given-up-other")
		later := h.Send(h.Inbound(session, "alice", pt.Call("echo", `{"text":"2"}`)))
		ms := take(t, between+2)
		// As the runner ends a message it dead-letters (retries exhausted).
		if err := ms[0].TermWithReason("RETRIES_EXHAUSTED"); err != nil {
			t.Fatal(err)
		}
		settle(t, ms[1:1+between]...)
		floorAt(t, seqOf(t, ms[between]))
		// Well inside the order wait (a minute): only the floor settles it.
		if err := o.handle(ms[len(ms)-1]); err != nil {
			t.Fatalf("a turn behind a message ingest terminated: %v, want it to join", err)
		}
		if got, _ := o.order(session); !slices.Equal(got, []string{later}) {
			t.Fatalf("order %v, want [%s]", got, later)
		}
		if n := testMetric(t, o.reg, "tollgate_session_order_skipped_total"); n != 0 {
			t.Fatalf("%v messages skipped after the order wait, want none: the floor settled it", n)
		}
	})
}
