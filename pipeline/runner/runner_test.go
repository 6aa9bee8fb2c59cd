package runner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The runner tests consume the real TOLLGATE_TURNS stream through a durable
// consumer of their own and dead-letter into the real TOLLGATE_DLQ.

const (
	wait    = jstest.Wait // deadline for every wait; a passing test returns as soon as its condition holds
	stream  = topology.StreamTurns
	filter  = topology.SubjectTurnAccepted + ">"
	durable = "runner-test"
)

func subject(key string) string { return topology.AcceptedSubject(key) }

// harness is one runner on its own server, with its metrics on a fresh
// registry and its log kept for failed tests.
type harness struct {
	t     *testing.T
	env   *jstest.Env
	ctx   context.Context
	reg   *prometheus.Registry
	stage string
	cfg   runner.Config
	log   *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarness(t *testing.T, stage string) *harness {
	t.Helper()
	env := jstest.Start(t)
	reg := prometheus.NewRegistry()
	logs := &syncBuffer{}
	h := &harness{
		t: t, env: env, ctx: jstest.Ctx(t), reg: reg, stage: stage, log: logs,
		cfg: runner.Config{
			Component: stage,
			Stream:    stream,
			Consumer:  jetstream.ConsumerConfig{Durable: durable, FilterSubject: filter},
			JS:        env.JS,
			Logger:    slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Metrics:   runner.NewMetrics(reg),
		},
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("runner log:\n%s", logs.String())
		}
	})
	return h
}

// run starts a runner with h.cfg and handler and returns a function that
// cancels it and waits for Run's result. The runner is stopped at the end
// of the test in any case.
func (h *harness) run(handler runner.Handler) (stop func() error) {
	h.t.Helper()
	_, stop = h.start(handler)
	return stop
}

// start is run that also returns the runner; each setup function is applied
// to it before Run (test hooks such as runner.SetClock).
func (h *harness) start(handler runner.Handler, setup ...func(*runner.Runner)) (r *runner.Runner, stop func() error) {
	h.t.Helper()
	cfg := h.cfg
	cfg.Handler = handler
	r, err := runner.New(cfg)
	if err != nil {
		h.t.Fatalf("runner.New: %v", err)
	}
	for _, f := range setup {
		f(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-jstest.After(wait):
				result = errors.New("Run did not return after its context was cancelled")
			}
		})
		return result
	}
	h.t.Cleanup(func() {
		if err := stop(); err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
	// The consumer exists once Run has created it.
	jstest.Eventually(h.t, wait, "consumer created", func() bool {
		_, err := h.env.JS.Consumer(h.ctx, stream, durable)
		return err == nil
	})
	return r, stop
}

// publish stores data on subj and returns its stream sequence.
func (h *harness) publish(subj string, data []byte, hdr nats.Header) uint64 {
	h.t.Helper()
	ack, err := h.env.JS.PublishMsg(h.ctx, &nats.Msg{Subject: subj, Data: data, Header: hdr})
	if err != nil {
		h.t.Fatalf("publish %s: %v", subj, err)
	}
	return ack.Sequence
}

// metric reads a counter (or a histogram's sample count) of h's stage from
// h's registry; code selects the dead-letter reason code.
func (h *harness) metric(name string, code ...string) float64 {
	h.t.Helper()
	want := map[string]string{"stage": h.stage}
	if len(code) > 0 {
		want["code"] = code[0]
	}
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}

const (
	mReceived     = "tollgate_messages_received_total"
	mAcked        = "tollgate_messages_acked_total"
	mRetried      = "tollgate_messages_retried_total"
	mDeadLettered = "tollgate_messages_dead_lettered_total"
	mPanics       = "tollgate_handler_panics_total"
	mRestarts     = "tollgate_consume_restarts_total"
	mDuration     = "tollgate_message_processing_seconds"
)

func (h *harness) waitMetric(name string, want float64, code ...string) {
	h.t.Helper()
	jstest.Eventually(h.t, wait, fmt.Sprintf("%s%v == %v", name, code, want), func() bool {
		return h.metric(name, code...) == want
	})
}

func (h *harness) consumerInfo() *jetstream.ConsumerInfo {
	h.t.Helper()
	c, err := h.env.JS.Consumer(h.ctx, stream, durable)
	if err != nil {
		h.t.Fatalf("consumer: %v", err)
	}
	info, err := c.Info(h.ctx)
	if err != nil {
		h.t.Fatalf("consumer info: %v", err)
	}
	return info
}

// waitSettled waits until every message up to seq has been acknowledged
// (acked or terminated) and nothing is pending or in flight.
func (h *harness) waitSettled(seq uint64) {
	h.t.Helper()
	var last *jetstream.ConsumerInfo
	jstest.Eventually(h.t, wait, "consumer settled", func() bool {
		last = h.consumerInfo()
		return last.AckFloor.Stream >= seq && last.NumAckPending == 0 && last.NumPending == 0
	})
}

// deadLetters returns the messages in TOLLGATE_DLQ on tollgate.dlq.<stage>.
func (h *harness) deadLetters() []*jetstream.RawStreamMsg {
	h.t.Helper()
	s, err := h.env.JS.Stream(h.ctx, topology.StreamDLQ)
	if err != nil {
		h.t.Fatalf("dlq stream: %v", err)
	}
	info, err := s.Info(h.ctx)
	if err != nil {
		h.t.Fatalf("dlq info: %v", err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(h.ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			h.t.Fatalf("dlq get %d: %v", seq, err)
		}
		if m.Subject == topology.DLQSubject(h.stage) {
			out = append(out, m)
		}
	}
	return out
}

func (h *harness) waitDeadLetters(n int) []*jetstream.RawStreamMsg {
	h.t.Helper()
	var got []*jetstream.RawStreamMsg
	jstest.Eventually(h.t, wait, fmt.Sprintf("%d dead letters", n), func() bool {
		got = h.deadLetters()
		return len(got) >= n
	})
	if len(got) != n {
		h.t.Fatalf("%d dead letters, want %d", len(got), n)
	}
	return got
}

// counter counts handler calls per message body.
type counter struct {
	mu sync.Mutex
	n  map[string]int
	// deliveries holds NumDelivered as the handler saw it, per body.
	deliveries map[string][]uint64
}

func newCounter() *counter {
	return &counter{n: map[string]int{}, deliveries: map[string][]uint64{}}
}

func (c *counter) see(m jetstream.Msg) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := string(m.Data())
	c.n[k]++
	if meta, err := m.Metadata(); err == nil {
		c.deliveries[k] = append(c.deliveries[k], meta.NumDelivered)
	}
	return c.n[k]
}

func (c *counter) get(body string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[body]
}

func (c *counter) seenDeliveries(body string) []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]uint64(nil), c.deliveries[body]...)
}

func TestNewValidatesConfig(t *testing.T) {
	base := func() runner.Config {
		return runner.Config{
			Component: "s",
			Stream:    stream,
			Consumer:  jetstream.ConsumerConfig{Durable: durable},
			Handler:   func(context.Context, jetstream.Msg) error { return nil },
			JS:        fakeJS{},
			Logger:    slog.New(slog.DiscardHandler),
			Metrics:   runner.NewMetrics(nil),
		}
	}
	cases := []struct {
		name   string
		mutate func(*runner.Config)
		want   string
	}{
		{"no component", func(c *runner.Config) { c.Component = "" }, "Component"},
		{"a Stage other than the Component", func(c *runner.Config) { c.Stage = "t" }, "differ"},
		{"no stream", func(c *runner.Config) { c.Stream = "" }, "Stream"},
		{"no durable name", func(c *runner.Config) { c.Consumer.Durable = "" }, "Durable"},
		{"no handler", func(c *runner.Config) { c.Handler = nil }, "Handler"},
		{"no JetStream", func(c *runner.Config) { c.JS = nil }, "JS"},
		{"no logger", func(c *runner.Config) { c.Logger = nil }, "Logger"},
		{"no metrics", func(c *runner.Config) { c.Metrics = nil }, "Metrics"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.mutate(&cfg)
			r, err := runner.New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error naming %s", err, tc.want)
			}
			if r != nil {
				t.Errorf("New returned a runner with its error")
			}
		})
	}
	if _, err := runner.New(base()); err != nil {
		t.Errorf("New with a complete config: %v", err)
	}
	old := base()
	old.Component, old.Stage = "", "s"
	if _, err := runner.New(old); err != nil {
		t.Errorf("New with the former name Stage alone: %v", err)
	}
}

// fakeJS only fills the JS field for config validation; it is never called.
type fakeJS struct{ jetstream.JetStream }

func TestAckOnSuccess(t *testing.T) {
	h := newHarness(t, "acktest")
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		return nil
	})
	seq := h.publish(subject("s-1"), []byte("hello"), nil)
	h.waitSettled(seq)
	h.waitMetric(mAcked, 1)

	if got := seen.get("hello"); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
	if got := h.metric(mReceived); got != 1 {
		t.Errorf("received = %v, want 1", got)
	}
	if got := h.metric(mDuration); got != 1 {
		t.Errorf("%d duration observations, want 1", int(got))
	}
	if got := h.metric(mRetried); got != 0 {
		t.Errorf("retried = %v, want 0", got)
	}
	if info := h.consumerInfo(); info.NumRedelivered != 0 {
		t.Errorf("%d redeliveries", info.NumRedelivered)
	}
	if dl := h.deadLetters(); len(dl) != 0 {
		t.Errorf("%d dead letters", len(dl))
	}
}

func TestCodedErrorIsDeadLettered(t *testing.T) {
	h := newHarness(t, "dltest")
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		if string(m.Data()) == "ok" {
			return nil
		}
		return fmt.Errorf("decode turn: %w", schemas.Errorf(schemas.CodeMalformed, "not msgpack"))
	})
	body := []byte{0xc1, 0x00, 0xff, 'b', 'a', 'd'}
	subj := subject("s-1")
	hdr := nats.Header{}
	hdr.Set("X-Trace-Id", "trace-42")
	hdr.Set(jetstream.MsgIDHeader, "original-id")
	seq := h.publish(subj, body, hdr)

	dl := h.waitDeadLetters(1)[0]
	if !bytes.Equal(dl.Data, body) {
		t.Errorf("dead letter body %x, want the original %x", dl.Data, body)
	}
	wantHeaders := map[string]string{
		runner.HeaderCode:            string(schemas.CodeMalformed),
		runner.HeaderStage:           "dltest",
		runner.HeaderOriginalSubject: subj,
		runner.HeaderOriginalStream:  stream,
		runner.HeaderOriginalSeq:     strconv.FormatUint(seq, 10),
		runner.HeaderDeliveries:      "1",
		"X-Trace-Id":                 "trace-42",
	}
	for k, want := range wantHeaders {
		if got := dl.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	if r := dl.Header.Get(runner.HeaderReason); !strings.Contains(r, "not msgpack") {
		t.Errorf("reason header %q does not carry the cause", r)
	}
	if id := dl.Header.Get(jetstream.MsgIDHeader); id == "original-id" {
		t.Errorf("the dead letter reuses the original message id")
	}
	h.waitMetric(mDeadLettered, 1, string(schemas.CodeMalformed))

	// Not redelivered: once a later message on the same subject (same shard,
	// so handled after it) is acked, the bad one has still been seen once.
	next := h.publish(subj, []byte("ok"), nil)
	h.waitSettled(next)
	h.waitMetric(mAcked, 1)
	if got := seen.get(string(body)); got != 1 {
		t.Errorf("the dead-lettered message was handled %d times, want 1", got)
	}
	if got := h.metric(mRetried); got != 0 {
		t.Errorf("retried = %v, want 0", got)
	}
}

func TestTransientErrorIsRetried(t *testing.T) {
	h := newHarness(t, "retrytest")
	h.cfg.BaseDelay = 10 * time.Millisecond
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		if seen.see(m) <= 2 {
			return errors.New("tool backend unavailable")
		}
		return nil
	})
	seq := h.publish(subject("s-1"), []byte("flaky"), nil)
	h.waitSettled(seq)
	h.waitMetric(mAcked, 1)

	if got := seen.seenDeliveries("flaky"); fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("handler saw deliveries %v, want [1 2 3]", got)
	}
	if got := h.metric(mRetried); got != 2 {
		t.Errorf("retried = %v, want 2", got)
	}
	if got := h.metric(mReceived); got != 3 {
		t.Errorf("received = %v, want 3", got)
	}
	if dl := h.deadLetters(); len(dl) != 0 {
		t.Errorf("%d dead letters for a message that succeeded", len(dl))
	}
}

func TestRetriesExhausted(t *testing.T) {
	h := newHarness(t, "exhausttest")
	h.cfg.BaseDelay = 10 * time.Millisecond
	h.cfg.MaxAttempts = 3
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		if string(m.Data()) == "ok" {
			return nil
		}
		return errors.New("still down")
	})
	subj := subject("s-1")
	seq := h.publish(subj, []byte("doomed"), nil)

	dl := h.waitDeadLetters(1)[0]
	if got := dl.Header.Get(runner.HeaderCode); got != string(schemas.CodeRetriesExhausted) {
		t.Errorf("code %q, want RETRIES_EXHAUSTED", got)
	}
	if got := dl.Header.Get(runner.HeaderDeliveries); got != "3" {
		t.Errorf("deliveries header %q, want 3", got)
	}
	if got := dl.Header.Get(runner.HeaderOriginalSeq); got != strconv.FormatUint(seq, 10) {
		t.Errorf("original seq %q, want %d", got, seq)
	}
	if r := dl.Header.Get(runner.HeaderReason); !strings.Contains(r, "still down") {
		t.Errorf("reason %q does not carry the last error", r)
	}
	if string(dl.Data) != "doomed" {
		t.Errorf("body %q", dl.Data)
	}
	h.waitMetric(mDeadLettered, 1, string(schemas.CodeRetriesExhausted))

	next := h.publish(subj, []byte("ok"), nil)
	h.waitSettled(next)
	if got := seen.seenDeliveries("doomed"); fmt.Sprint(got) != "[1 2 3]" {
		t.Errorf("handler saw deliveries %v, want exactly [1 2 3]", got)
	}
	if got := h.metric(mRetried); got != 2 {
		t.Errorf("retried = %v, want 2", got)
	}
}

func TestPanicIsDeadLetteredAndTheRunnerGoesOn(t *testing.T) {
	h := newHarness(t, "panictest")
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		if string(m.Data()) == "poison" {
			var rec *schemas.BatchRecord
			_ = rec.TurnID // nil dereference
		}
		return nil
	})
	subj := subject("s-1")
	h.publish(subj, []byte("poison"), nil)
	next := h.publish(subj, []byte("next"), nil)

	dl := h.waitDeadLetters(1)[0]
	if got := dl.Header.Get(runner.HeaderCode); got != string(schemas.CodeHandlerPanic) {
		t.Errorf("code %q, want HANDLER_PANIC", got)
	}
	if r := dl.Header.Get(runner.HeaderReason); !strings.Contains(r, "nil pointer") {
		t.Errorf("reason %q does not name the panic", r)
	}
	h.waitSettled(next)
	h.waitMetric(mAcked, 1)
	h.waitMetric(mPanics, 1)
	h.waitMetric(mDeadLettered, 1, string(schemas.CodeHandlerPanic))
	if seen.get("next") != 1 || seen.get("poison") != 1 {
		t.Errorf("handled poison %d times and next %d times, want 1 and 1", seen.get("poison"), seen.get("next"))
	}
}

// Messages with the same subject are handled one at a time in publish
// order; different subjects run concurrently.
func TestPerSubjectOrderWithConcurrency(t *testing.T) {
	h := newHarness(t, "ordertest")
	h.cfg.Concurrency = 4
	const keys, perKey = 8, 25

	var mu sync.Mutex
	order := map[string][]int{}
	var inFlight, maxInFlight atomic.Int32
	parallel := make(chan struct{})
	var parallelOnce sync.Once
	h.run(func(_ context.Context, m jetstream.Msg) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			old := maxInFlight.Load()
			if n <= old || maxInFlight.CompareAndSwap(old, n) {
				break
			}
		}
		if n >= 2 {
			parallelOnce.Do(func() { close(parallel) })
		}
		key, idx, _ := strings.Cut(string(m.Data()), "/")
		i, _ := strconv.Atoi(idx)
		if i == 0 {
			// The first message of each key waits (bounded) until two
			// handlers overlap, which only happens if keys run in parallel.
			select {
			case <-parallel:
			case <-jstest.After(wait):
			}
		}
		mu.Lock()
		order[key] = append(order[key], i)
		mu.Unlock()
		return nil
	})

	var last uint64
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			last = h.publish(subject(fmt.Sprintf("s-%d", k)), fmt.Appendf(nil, "s-%d/%d", k, i), nil)
		}
	}
	h.waitSettled(last)
	h.waitMetric(mAcked, keys*perKey)

	mu.Lock()
	defer mu.Unlock()
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("s-%d", k)
		got := order[key]
		if len(got) != perKey {
			t.Errorf("%s: handled %d messages, want %d", key, len(got), perKey)
			continue
		}
		for i, v := range got {
			if v != i {
				t.Errorf("%s: handled out of publish order: %v", key, got)
				break
			}
		}
	}
	if m := maxInFlight.Load(); m < 2 {
		t.Errorf("at most %d handler ran at once; different subjects should run concurrently", m)
	}
	if m := maxInFlight.Load(); m > 4 {
		t.Errorf("%d handlers ran at once with Concurrency 4", m)
	}
}

// Cancelling Run stops pulling, lets the in-flight handler finish with a
// live context, acks its message and only then returns nil.
func TestRunDrainsOnCancel(t *testing.T) {
	h := newHarness(t, "draintest")
	started := make(chan struct{})
	release := make(chan struct{})
	var handlerCtxErr atomic.Value
	var finished atomic.Bool
	stop := h.run(func(ctx context.Context, m jetstream.Msg) error {
		close(started)
		<-release
		handlerCtxErr.Store(fmt.Sprint(ctx.Err()))
		finished.Store(true)
		return nil
	})
	seq := h.publish(subject("s-1"), []byte("slow"), nil)
	select {
	case <-started:
	case <-jstest.After(wait):
		t.Fatal("handler did not start")
	}

	result := make(chan error, 1)
	go func() { result <- stop() }()
	// Run must not return while the handler is still running. Showing that
	// something does not happen needs a window; 200ms is ample for a
	// broken Run, which would return at once.
	select {
	case err := <-result:
		t.Fatalf("Run returned (%v) while a handler was in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("Run: %v, want nil after a drain", err)
		}
	case <-jstest.After(wait):
		t.Fatal("Run did not return after the handler finished")
	}
	if !finished.Load() {
		t.Fatal("Run returned before the handler finished")
	}
	if got := handlerCtxErr.Load(); got != "<nil>" {
		t.Errorf("the handler's context was %v during the drain, want live", got)
	}
	if got := h.metric(mAcked); got != 1 {
		t.Errorf("acked = %v, want 1", got)
	}
	h.waitSettled(seq)
}

// A dead letter that cannot be stored is not lost: the message is retried
// until the dead-letter stream is back, then dead-lettered once.
func TestDeadLetterPublishFailureIsRetried(t *testing.T) {
	h := newHarness(t, "dlqdown")
	h.cfg.BaseDelay = 10 * time.Millisecond
	if err := h.env.JS.DeleteStream(h.ctx, topology.StreamDLQ); err != nil {
		t.Fatal(err)
	}
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		return schemas.Errorf(schemas.CodeUnknownMessage, "unknown")
	})
	seq := h.publish(subject("s-1"), []byte("orphan"), nil)

	jstest.Eventually(t, wait, "the failed dead letter is retried", func() bool {
		return seen.get("orphan") >= 3
	})
	if got := h.metric(mDeadLettered, string(schemas.CodeUnknownMessage)); got != 0 {
		t.Fatalf("dead_lettered = %v while the DLQ stream is missing", got)
	}
	if info := h.consumerInfo(); info.AckFloor.Stream >= seq {
		t.Fatalf("the message was acknowledged although its dead letter was not stored")
	}

	if err := topology.Ensure(h.ctx, h.env.JS, topology.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	dl := h.waitDeadLetters(1)[0]
	if string(dl.Data) != "orphan" || dl.Header.Get(runner.HeaderCode) != string(schemas.CodeUnknownMessage) {
		t.Errorf("dead letter %q with code %q", dl.Data, dl.Header.Get(runner.HeaderCode))
	}
	if d, _ := strconv.Atoi(dl.Header.Get(runner.HeaderDeliveries)); d < 3 {
		t.Errorf("deliveries header %q, want at least 3", dl.Header.Get(runner.HeaderDeliveries))
	}
	h.waitSettled(seq)
	h.waitMetric(mDeadLettered, 1, string(schemas.CodeUnknownMessage))
	if got := h.metric(mRetried); got < 2 {
		t.Errorf("retried = %v, want the failed dead-letter attempts counted", got)
	}
}

// Headers the server acts on at publish time (Nats-Expected-Stream and the
// like) were set for the original stream. Copied onto the dead letter they
// would make its publish fail forever, so the message could never leave the
// retry loop.
func TestDeadLetterOfAMessageWithPublishDirectives(t *testing.T) {
	h := newHarness(t, "directives")
	h.cfg.BaseDelay = 10 * time.Millisecond
	h.run(func(context.Context, jetstream.Msg) error {
		return schemas.Errorf(schemas.CodeMalformed, "bad")
	})
	hdr := nats.Header{}
	hdr.Set("Nats-Expected-Stream", stream)
	hdr.Set("Nats-Expected-Last-Subject-Sequence", "0")
	hdr.Set("X-Trace-Id", "trace-7")
	seq := h.publish(subject("s-1"), []byte("directed"), hdr)

	dl := h.waitDeadLetters(1)[0]
	if string(dl.Data) != "directed" || dl.Header.Get("X-Trace-Id") != "trace-7" {
		t.Errorf("dead letter %q with trace header %q", dl.Data, dl.Header.Get("X-Trace-Id"))
	}
	h.waitSettled(seq)
	h.waitMetric(mDeadLettered, 1, string(schemas.CodeMalformed))
}

// A message at the size limit has no room for the dead-letter headers. It
// must still be dead-lettered (with as much of its body as fits, and a
// header saying so) rather than retried forever.
func TestDeadLetterOfAMessageAtTheSizeLimit(t *testing.T) {
	h := newHarness(t, "huge")
	h.cfg.BaseDelay = 10 * time.Millisecond
	h.run(func(context.Context, jetstream.Msg) error {
		return schemas.Errorf(schemas.CodePayloadTooLarge, "too large")
	})
	limit := int(h.env.NC.MaxPayload())
	body := bytes.Repeat([]byte("0123456789abcdef"), limit/16)[:limit-64]
	hdr := nats.Header{}
	hdr.Set("X-Trace-Id", "trace-9")
	seq := h.publish(subject("s-1"), body, hdr)

	dl := h.waitDeadLetters(1)[0]
	if len(dl.Data) == 0 || len(dl.Data) >= len(body) || !bytes.HasPrefix(body, dl.Data) {
		t.Errorf("dead letter body is %d bytes, want a proper prefix of the %d-byte original", len(dl.Data), len(body))
	}
	if got := dl.Header.Get(runner.HeaderTruncated); got != strconv.Itoa(len(body)) {
		t.Errorf("%s = %q, want the original size %d", runner.HeaderTruncated, got, len(body))
	}
	if dl.Header.Get(runner.HeaderCode) != string(schemas.CodePayloadTooLarge) || dl.Header.Get(runner.HeaderOriginalSeq) != strconv.FormatUint(seq, 10) {
		t.Errorf("headers %v", dl.Header)
	}
	h.waitSettled(seq)
	h.waitMetric(mDeadLettered, 1, string(schemas.CodePayloadTooLarge))

	// A message with room to spare keeps its whole body and is not marked.
	small := h.publish(subject("s-2"), []byte("small"), nil)
	dls := h.waitDeadLetters(2)
	if string(dls[1].Data) != "small" || dls[1].Header.Get(runner.HeaderTruncated) != "" {
		t.Errorf("small dead letter %q, truncated header %q", dls[1].Data, dls[1].Header.Get(runner.HeaderTruncated))
	}
	h.waitSettled(small)
}

// Two stages consuming one stream can both dead-letter the same message;
// each dead letter must be stored, not deduplicated against the other.
func TestTwoStagesDeadLetterTheSameMessage(t *testing.T) {
	h := newHarness(t, "first")
	h.run(func(context.Context, jetstream.Msg) error {
		return schemas.Errorf(schemas.CodeUnknownMessage, "first stage")
	})
	other := h.cfg
	other.Component = "second"
	other.Consumer = jetstream.ConsumerConfig{Durable: "runner-test-second", FilterSubject: filter}
	other.Handler = func(context.Context, jetstream.Msg) error {
		return schemas.Errorf(schemas.CodeUnknownMessage, "second stage")
	}
	r2, err := runner.New(other)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r2.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("second Run: %v", err)
		}
	})

	h.publish(subject("s-1"), []byte("shared"), nil)
	h.waitDeadLetters(1)
	second := &harness{t: t, env: h.env, ctx: h.ctx, reg: h.reg, stage: "second"}
	dl := second.waitDeadLetters(1)[0]
	if string(dl.Data) != "shared" || dl.Header.Get(runner.HeaderStage) != "second" {
		t.Errorf("second stage's dead letter %q from stage %q", dl.Data, dl.Header.Get(runner.HeaderStage))
	}
}

// waitingErr asks to be retried soon; it is not a failure.
type waitingErr struct{}

func (waitingErr) Error() string             { return "waits for an earlier message" }
func (waitingErr) RetryAfter() time.Duration { return 10 * time.Millisecond }

func TestAWaitingMessageIsRetriedPastMaxAttemptsAndNeverDeadLettered(t *testing.T) {
	h := newHarness(t, "waittest")
	h.cfg.MaxAttempts = 3
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		if n := seen.see(m); n <= 6 { // twice MaxAttempts deliveries of waiting
			return fmt.Errorf("turn t-2: %w", waitingErr{})
		}
		return nil
	})
	seq := h.publish(subject("s-1"), []byte("later turn"), nil)
	h.waitSettled(seq)
	if got := seen.get("later turn"); got != 7 {
		t.Fatalf("handled %d times, want 7 (6 waits, then done)", got)
	}
	if dl := h.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters for a message that only waited", len(dl))
	}
	h.waitMetric(mAcked, 1)
}

// A message that waited past MaxAttempts deliveries (a turn behind an
// earlier one of its session) and then fails transiently once, as when the
// broker restarts, still gets its retries: its waits were no failures
// (chaos seed 450231940 dead-lettered such a turn RETRIES_EXHAUSTED on its
// first failure, and the session's later turn ended before an earlier one).
func TestAFailureAfterWaitingIsRetriedNotExhausted(t *testing.T) {
	h := newHarness(t, "waitfailtest")
	h.cfg.MaxAttempts = 3
	h.cfg.BaseDelay, h.cfg.MaxDelay = time.Second, 2*time.Second // MaxAttempts failures take 3s
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		switch n := seen.see(m); {
		case n <= 6:
			return fmt.Errorf("turn t-2: %w", waitingErr{})
		case n == 7:
			return errors.New("kv: context deadline exceeded")
		}
		return nil
	})
	seq := h.publish(subject("s-1"), []byte("later turn"), nil)
	h.waitSettled(seq)
	if dl := h.deadLetters(); len(dl) != 0 {
		t.Fatalf("%d dead letters (%s) for a message that waited, then failed once", len(dl), dl[0].Header.Get(runner.HeaderCode))
	}
	if got := seen.get("later turn"); got != 8 {
		t.Fatalf("handled %d times, want 8 (6 waits, a failure, then done)", got)
	}
	h.waitMetric(mAcked, 1)
}
