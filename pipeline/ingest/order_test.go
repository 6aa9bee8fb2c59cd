package ingest_test

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

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
