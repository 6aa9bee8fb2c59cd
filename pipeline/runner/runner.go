// Package runner drives one stage's durable pull consumer: it hands each
// message to a Handler and turns the result into an explicit outcome.
//
//   - nil: Ack.
//   - a permanent error (schemas.Permanent: it carries a schemas.Code): the
//     message can never succeed; it is copied to the dead-letter stream with
//     its original bytes and the code, then terminated with TermWithReason.
//   - a Waiting error: NakWithDelay(RetryAfter()), not counted as a failure.
//   - any other error: transient; NakWithDelay with a growing delay, until
//     MaxAttempts deliveries (and as long as that many failures take: the
//     deliveries of Waiting NAKs are not failures), then dead-lettered with
//     RETRIES_EXHAUSTED.
//   - a panic: recovered, counted, dead-lettered with HANDLER_PANIC.
//
// A dead letter always fits the dead-letter stream: the original's headers
// and body are cut to JetStream's header and message size limits where they
// must be, and the cut is marked (HeaderHeadersTruncated, HeaderTruncated).
// If the dead letter cannot be stored (the stream is unreachable), the
// message is NAKed with a growing delay and tried again on later
// deliveries, a bounded number of times (see Config.OnDeadLetter and
// DeadLetterTries); past the bound, or at once when the stream refuses the
// dead letter for good, the message is given up: an error is logged with
// its stream and sequence, where it stays, and it is terminated. While a
// message is held (running, or queued behind its key), the runner signals
// InProgress so that work longer than AckWait is not redelivered under it.
//
// Messages with the same shard key (by default the subject's last token:
// the session key, turn id or approval id that Tollgate subjects end in, so
// that e.g. a turn's accepted message and its ready notice share a key) are
// handled one
// at a time in delivery order; different keys run concurrently on up to
// Concurrency workers, and a slow key never holds up another (it occupies
// one worker; its later messages wait in its own queue).
//
// A watchdog (watchdog.go) restarts the consume loop when deliveries stall
// while the consumer has work and no pull request (nats.go issue #2063,
// github.com/nats-io/nats.go/issues/2063).
//
// Traces: each delivery is handled in a span of Config.TracerProvider (a
// consumer span named after the stage), the child of the trace context the
// message's headers carry (package tracing). Its attributes name the
// stage, the subject, the turn id, approval id or session key the subject
// ends in, and the outcome (tollgate.outcome: ack, nak, dead_letter or
// term). The handler's context holds the span, so that what it publishes
// (package bus) and the tools it calls continue the trace.
//
// Run binds to its durable consumer when it exists with the runner's
// configuration (ConsumerConfig; provisioned by `tollgate provision`) and
// creates or updates it otherwise. Readiness: a runner is ready
// (Runner.Ready, Metrics.Consuming) only while it consumes: not while it
// binds its consumer, and not once its context is cancelled and it drains.
package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
)

// Handler processes one message. See the package doc for how its result is
// acknowledged. Handlers must be idempotent: delivery is at least once.
type Handler func(ctx context.Context, msg jetstream.Msg) error

// Dead-letter headers. The body of a dead letter is the original message.
const (
	HeaderStage           = "Tollgate-Stage"
	HeaderCode            = "Tollgate-Reason-Code"
	HeaderReason          = "Tollgate-Reason"
	HeaderOriginalSubject = "Tollgate-Original-Subject"
	HeaderOriginalStream  = "Tollgate-Original-Stream"
	HeaderOriginalSeq     = "Tollgate-Original-Seq"
	HeaderDeliveries      = "Tollgate-Deliveries"
	// HeaderTruncated is set, to the original body's size in bytes, when
	// the original was too large to carry whole with the dead-letter
	// headers; the body is then its longest prefix that fits. The whole
	// original stays in its stream at Tollgate-Original-Stream/-Seq.
	HeaderTruncated = "Tollgate-Truncated"
	// HeaderHeadersTruncated is set when some of the original's headers
	// did not fit JetStream's limit on a message's header block (64 KiB)
	// next to the dead-letter headers. Its value, "<n> keys, <b> bytes",
	// says how many header keys were left out and how many bytes they
	// took. The original's smallest headers are kept first, whole (a
	// header is never cut part-way).
	HeaderHeadersTruncated = "Tollgate-Headers-Truncated"
)

// Config wires a runner.
type Config struct {
	// Component names what consumes: a stage ("executor") or a transport
	// ("slack", "webhook"). It is the value of the runner metrics'
	// "stage" label (the label keeps its name and its values, so that
	// dashboards do not change), the dead-letter subject token
	// (topology.DLQSubject), the Tollgate-Stage header of a dead letter,
	// and the name of each delivery's span.
	Component string
	// Deprecated: Stage is the former name of Component. A Config that
	// sets Stage alone runs as if Component were Stage; one that sets both
	// to different names is refused.
	Stage    string
	Stream   string
	Consumer jetstream.ConsumerConfig // Durable and FilterSubject(s) required
	Handler  Handler
	JS       jetstream.JetStream
	Logger   *slog.Logger // should carry the stage attribute; the runner does not add it
	Metrics  *Metrics

	// Optional; zero values get the defaults below.
	MaxAttempts int                        // deliveries before dead-lettering a transient failure (default 50)
	Concurrency int                        // workers (default 1)
	ShardKey    func(jetstream.Msg) string // default: LastToken of the subject
	// OnDeadLetter, if set, runs before a message is dead-lettered, so the
	// stage can close out the work the message was driving (for a turn:
	// fail its batch closed, so it still reaches a terminal outcome and its
	// session moves on). It must be idempotent; its context ends after
	// Consumer.AckWait. If it fails (or panics), the message is not
	// dead-lettered yet but NAKed with a growing delay, and the hook runs
	// again on its next delivery. That is bounded: once the message has
	// been delivered DeadLetterTries times, a failing hook is logged as an
	// error and the message is dead-lettered anyway (the redriver's
	// recovery sweep picks up, from KV, a batch whose driving message was
	// dead-lettered).
	OnDeadLetter func(ctx context.Context, m jetstream.Msg, code schemas.Code, cause error) error
	BaseDelay    time.Duration // first NAK delay (default 250ms), doubled per attempt, capped at MaxDelay
	MaxDelay     time.Duration // default 30s
	// DeadLetterTries bounds the deliveries of a message whose dead letter
	// cannot be completed (see OnDeadLetter and the package doc); default
	// 2*MaxAttempts, at least 25 minutes of failures at the default delays.
	// Like MaxAttempts it counts every delivery, Waiting ones included.
	DeadLetterTries int
	// The consume-loop watchdog (see watchdog.go) restarts consuming when
	// nothing has been delivered for StallWindow while the consumer has
	// work and no pull request. It looks every StallCheck.
	StallWindow time.Duration // default 30s; negative disables the watchdog
	StallCheck  time.Duration // default 5s, at most StallWindow
	// TracerProvider traces each delivery (see the package doc); nil is
	// otel's global provider, a no-op one unless the program set another.
	TracerProvider trace.TracerProvider
}

// Validate reports missing wiring.
func (c *Config) Validate() error {
	switch {
	case c.Component == "" && c.Stage == "":
		return errors.New("runner: Component (formerly Stage) is required")
	case c.Component != "" && c.Stage != "" && c.Component != c.Stage:
		return fmt.Errorf("runner: Stage %q and Component %q differ (Stage is the former name of Component)", c.Stage, c.Component)
	case c.Stream == "":
		return errors.New("runner: Stream is required")
	case c.Consumer.Durable == "":
		return errors.New("runner: Consumer.Durable is required")
	case c.Handler == nil:
		return errors.New("runner: Handler is required")
	case c.JS == nil:
		return errors.New("runner: JS is required")
	case c.Logger == nil:
		return errors.New("runner: Logger is required")
	case c.Metrics == nil:
		return errors.New("runner: Metrics is required")
	}
	return nil
}

func (c *Config) defaults() {
	if c.Component == "" {
		c.Component = c.Stage
	}
	c.Stage = c.Component
	// With delays capped at MaxDelay (30s), 50 attempts ride out about 23
	// minutes of broker or KV trouble, and any execution-claim lease
	// (default 2m), before a message is given up to the dead-letter stream.
	// Giving up early would leave a batch half done.
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 50
	}
	if c.DeadLetterTries <= 0 {
		c.DeadLetterTries = 2 * c.MaxAttempts
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 1
	}
	if c.ShardKey == nil {
		c.ShardKey = LastToken
	}
	if c.BaseDelay <= 0 {
		c.BaseDelay = 250 * time.Millisecond
	}
	if c.MaxDelay <= 0 {
		c.MaxDelay = 30 * time.Second
	}
	if c.StallWindow == 0 {
		c.StallWindow = DefaultStallWindow
	}
	if c.StallCheck <= 0 {
		c.StallCheck = DefaultStallCheck
	}
	if c.StallWindow > 0 && c.StallCheck > c.StallWindow {
		c.StallCheck = c.StallWindow
	}
	c.Consumer = ConsumerConfig(c.Consumer)
}

// ConsumerConfig is cc as a runner creates it: explicit acks, AckWait 30s
// and MaxAckPending 1024 where cc leaves them zero, and no MaxDeliver. It
// is the configuration that provisioning creates for a stage and that a
// stage started without provisioning checks for (tollgate.StageConsumers).
func ConsumerConfig(cc jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	if cc.AckPolicy == jetstream.AckNonePolicy {
		cc.AckPolicy = jetstream.AckExplicitPolicy
	}
	if cc.AckWait == 0 {
		cc.AckWait = 30 * time.Second
	}
	// The runner, not the server, decides when to give up, so that a message
	// is dead-lettered rather than silently parked at MaxDeliver.
	cc.MaxDeliver = -1
	if cc.MaxAckPending == 0 {
		cc.MaxAckPending = 1024
	}
	return cc
}

// Waiting is an error a handler returns when its message cannot be handled
// yet because it must wait for another message to be handled first (not
// because something failed). The runner NAKs it with RetryAfter and does
// not count the delivery toward MaxAttempts; the handler must bound the
// wait itself (the executor's session order gives up waiting after
// OrderWait).
type Waiting interface {
	error
	RetryAfter() time.Duration
}

// subjectKey is the span attribute naming what subject's last token is
// (topology.Route.Key): the approval id of a decision, the turn id of an
// event, or else the session key (inbound, accepted and ready subjects).
func subjectKey(subject string) attribute.KeyValue {
	last := subject[strings.LastIndexByte(subject, '.')+1:]
	switch topology.RouteOf(subject).Key() {
	case topology.KeyApproval:
		return tracing.AttrApprovalID.String(last)
	case topology.KeyTurn:
		return tracing.AttrTurnID.String(last)
	default:
		return tracing.AttrSessionKey.String(last)
	}
}

// LastToken returns the last token of m's subject.
func LastToken(m jetstream.Msg) string {
	s := m.Subject()
	return s[strings.LastIndexByte(s, '.')+1:]
}

// Runner consumes one durable consumer.
type Runner struct {
	cfg Config
	now func() time.Time // the clock of the watchdog and the retry budget (exhausted); tests inject one

	// The stage's metric children, looked up once (a label lookup per
	// message is a hash and a lock).
	received, acked prometheus.Counter
	duration        prometheus.Observer
	tracer          trace.Tracer

	// state is where Run is (stateIdle...stateDraining), for readiness
	// (Ready, Metrics.Consuming).
	state atomic.Int32

	// For tests (export_test.go): the running loop, and whether the
	// watchdog only checks when told to.
	loop           atomic.Pointer[consumeLoop]
	manualWatchdog bool
}

// Run's states, for readiness.
const (
	stateIdle      int32 = iota // Run not running
	stateBinding                // creating or binding the consumer, starting the loop
	stateConsuming              // consuming
	stateDraining               // ctx cancelled: finishing what it holds
)

// Ready is nil while Run is consuming: the consumer is bound and a consume
// loop pulls from it. Otherwise it says why not: Run is not running, is
// still binding its consumer, is draining after its context was
// cancelled, or its watchdog's restart of the consume loop failed (it
// tries again).
func (r *Runner) Ready() error {
	name := r.cfg.Stream + "/" + r.cfg.Consumer.Durable
	switch r.state.Load() {
	case stateIdle:
		return fmt.Errorf("consumer %s: not running", name)
	case stateBinding:
		return fmt.Errorf("consumer %s: binding", name)
	case stateDraining:
		return fmt.Errorf("consumer %s: draining", name)
	}
	if l := r.loop.Load(); l == nil || l.current() == nil {
		return fmt.Errorf("consumer %s: consume loop stopped; restarting it", name)
	}
	return nil
}

// New validates cfg and returns a runner. Nothing touches the server until Run.
func New(cfg Config) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	return &Runner{
		cfg: cfg, now: time.Now,
		received: cfg.Metrics.Received.WithLabelValues(cfg.Component),
		acked:    cfg.Metrics.Acked.WithLabelValues(cfg.Component),
		duration: cfg.Metrics.Duration.WithLabelValues(cfg.Component),
		tracer:   tracing.Tracer(cfg.TracerProvider),
	}, nil
}

// Run creates or updates the consumer and processes messages until ctx is
// cancelled. On cancellation it stops pulling, finishes the messages already
// handed to it, and returns nil. It returns an error only if the consumer
// cannot be created or the consume loop cannot start.
func (r *Runner) Run(ctx context.Context) error {
	c := r.cfg
	r.state.Store(stateBinding)
	c.Metrics.track(r)
	defer func() { r.state.Store(stateIdle); c.Metrics.untrack(r) }()
	// A consumer that already matches (provisioned) is only bound.
	// Several replicas starting together create-or-update the same durable
	// at once; on a cluster some of those requests can go unanswered
	// (EnsureConsumer retries them).
	cons, err := topology.EnsureConsumer(ctx, c.JS, topology.ConsumerSpec{Stream: c.Stream, Config: c.Consumer})
	if err != nil {
		return fmt.Errorf("%s: create consumer %s/%s: %w", c.Component, c.Stream, c.Consumer.Durable, err)
	}

	// Handlers get a context that outlives ctx so in-flight work can finish
	// during a drain.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	d := newDispatcher(c.Concurrency, func(m jetstream.Msg, release func()) { r.handle(work, m, release) })
	stopKeepAlive := make(chan struct{})
	go d.keepAlive(c.Consumer.AckWait/3, stopKeepAlive)
	defer close(stopKeepAlive)

	l := &consumeLoop{r: r, cons: cons, d: d}
	if err := l.start(); err != nil {
		d.stop()
		return fmt.Errorf("%s: consume: %w", c.Component, err)
	}
	r.loop.Store(l)
	defer r.loop.Store(nil)
	r.state.Store(stateConsuming)
	c.Logger.Info("stage consuming", "stream", c.Stream, "consumer", c.Consumer.Durable)

	watchCtx, stopWatch := context.WithCancel(ctx)
	watching := make(chan struct{})
	go func() { defer close(watching); l.watch(watchCtx) }()

	<-ctx.Done()
	r.state.Store(stateDraining)
	// No restart may race the drain: stop the watchdog first.
	stopWatch()
	<-watching
	cc := l.current()
	if cc == nil {
		// A restart failed to start a new Consume: nothing is delivered.
		d.drain()
		c.Logger.Info("stage drained")
		return nil
	}
	cc.Drain()
	select {
	case <-cc.Closed():
		// No more deliveries: finish everything already held.
		d.drain()
	case <-time.After(c.Consumer.AckWait):
		// The drain is stuck: stop pulling and leave queued messages
		// unacknowledged, for redelivery.
		cc.Stop()
		d.stop()
	}
	c.Logger.Info("stage drained")
	return nil
}

// handle runs the handler for one delivery and settles it.
// release is called once the handler has returned, before the message is
// settled, so that no keep-alive is sent after an ack or NAK.
func (r *Runner) handle(ctx context.Context, m jetstream.Msg, release func()) {
	c := r.cfg
	start := time.Now()
	r.received.Inc()
	defer func() { r.duration.Observe(time.Since(start).Seconds()) }()
	ctx, span := r.tracer.Start(tracing.Extract(ctx, m.Headers()), c.Component, trace.WithSpanKind(trace.SpanKindConsumer))
	defer span.End()
	if span.IsRecording() { // not built at all when tracing is off
		span.SetAttributes(tracing.AttrStage.String(c.Component), attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", m.Subject()), subjectKey(m.Subject()))
	}

	err := r.invoke(ctx, m)
	release()

	meta, _ := m.Metadata()
	deliveries := uint64(1)
	if meta != nil {
		deliveries = meta.NumDelivered
	}
	// The message's logger, built only off the success path (or when an
	// ack fails): With clones the handler, a cost per message otherwise.
	logger := func() *slog.Logger {
		log := c.Logger.With("subject", m.Subject(), "delivery", deliveries)
		if meta != nil {
			log = log.With("stream_seq", meta.Sequence.Stream)
		}
		return log
	}

	if err == nil {
		span.SetAttributes(tracing.AttrOutcome.String(tracing.OutcomeAck))
		if aerr := m.Ack(); aerr != nil {
			logger().Warn("ack failed; message will be redelivered", "err", aerr)
			return
		}
		r.acked.Inc()
		return
	}
	log := logger()
	var waiting Waiting
	if !errors.As(err, &waiting) {
		span.RecordError(err)
	}
	switch {
	case schemas.Permanent(err):
		r.deadLetter(ctx, m, meta, schemas.CodeOf(err), err, log)
	case errors.As(err, &waiting):
		// Not a failure: the message waits its turn behind another one
		// (the handler bounds the wait itself), so it is retried after
		// the delay it asks for and never counts toward MaxAttempts.
		log.Debug("waiting; retrying", "reason", err, "delay", waiting.RetryAfter())
		r.retry(ctx, m, waiting.RetryAfter(), log)
	case r.exhausted(deliveries, meta):
		r.deadLetter(ctx, m, meta, schemas.CodeRetriesExhausted, err, log)
	default:
		delay := r.backoff(deliveries)
		log.Warn("transient failure; retrying", "err", err, "delay", delay)
		r.retry(ctx, m, delay, log)
	}
}

// exhausted reports whether a transient failure on a message delivered
// deliveries times has used up its MaxAttempts. JetStream counts every
// delivery, those a Waiting error NAKed too (a turn behind an earlier one of
// its session can be delivered hundreds of times in its bounded wait), and
// keeps no count of failures. So a message is given up only when it has
// been delivered MaxAttempts times and has also been stored for at least
// as long as MaxAttempts failures take at the backoff delays: the point at
// which a message that failed on every delivery is given up, unchanged,
// while one that waited first still gets its retries (bounded all the same:
// by that span of time).
func (r *Runner) exhausted(deliveries uint64, meta *jetstream.MsgMetadata) bool {
	if deliveries < uint64(r.cfg.MaxAttempts) {
		return false
	}
	if meta == nil || meta.Timestamp.IsZero() {
		return true
	}
	return r.now().Sub(meta.Timestamp) >= r.failureSpan()
}

// failureSpan is the least time MaxAttempts deliveries that all fail take:
// the sum of the backoff delays between them.
func (r *Runner) failureSpan() time.Duration {
	var span time.Duration
	for d := uint64(1); d < uint64(r.cfg.MaxAttempts); d++ {
		span += r.backoff(d)
	}
	return span
}

// backoff is the delay before the next attempt at a message delivered
// deliveries times: BaseDelay, doubled per delivery, capped at MaxDelay.
func (r *Runner) backoff(deliveries uint64) time.Duration {
	delay := r.cfg.BaseDelay << min(max(deliveries, 1)-1, 16)
	if delay > r.cfg.MaxDelay || delay <= 0 {
		delay = r.cfg.MaxDelay
	}
	return delay
}

// retry NAKs m for redelivery after delay and counts the retry.
func (r *Runner) retry(ctx context.Context, m jetstream.Msg, delay time.Duration, log *slog.Logger) {
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrOutcome.String(tracing.OutcomeNak))
	if nerr := m.NakWithDelay(delay); nerr != nil {
		log.Warn("nak failed; message will be redelivered after AckWait", "err", nerr)
	}
	r.cfg.Metrics.Retried.WithLabelValues(r.cfg.Component).Inc()
}

// invoke calls the handler, turning a panic into a HANDLER_PANIC error.
func (r *Runner) invoke(ctx context.Context, m jetstream.Msg) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.cfg.Metrics.Panics.WithLabelValues(r.cfg.Component).Inc()
			r.cfg.Logger.Error("handler panic", "panic", p, "stack", string(debug.Stack()))
			err = schemas.Errorf(schemas.CodeHandlerPanic, "handler panic: %v", p)
		}
	}()
	return r.cfg.Handler(ctx, m)
}

// deadLetter copies m to the dead-letter stream with its reason, then
// terminates it. If the work of m cannot be closed out (OnDeadLetter) or
// the copy cannot be stored, m is NAKed with a growing delay and tried
// again on its next delivery, until it has been delivered DeadLetterTries
// times. Past that bound a failing OnDeadLetter is logged and the dead
// letter written anyway; a dead letter that cannot be stored past the
// bound, or that the stream refuses for good (schemas.Permanent), gives m
// up: an error is logged naming its stream and sequence, where it stays,
// and m is terminated, so that no message is retried forever.
func (r *Runner) deadLetter(ctx context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata, code schemas.Code, cause error, log *slog.Logger) {
	c := r.cfg
	deliveries := uint64(1)
	if meta != nil {
		deliveries = meta.NumDelivered
	}
	lastTry := deliveries >= uint64(c.DeadLetterTries)
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(tracing.AttrCode.String(string(code)))
	if c.OnDeadLetter != nil {
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("OnDeadLetter panic: %v", p)
				}
			}()
			hctx, cancel := context.WithTimeout(ctx, c.Consumer.AckWait)
			defer cancel()
			return c.OnDeadLetter(hctx, m, code, cause)
		}()
		switch {
		case err != nil && !lastTry:
			delay := r.backoff(deliveries)
			log.Error("could not close out the work of a message before dead-lettering it; will retry", "code", code, "err", err, "delay", delay)
			r.retry(ctx, m, delay, log)
			return
		case err != nil:
			log.Error("could not close out the work of a message; dead-lettering it anyway after the last try", "code", code, "err", err, "tries", c.DeadLetterTries)
		}
	}
	// The dead letter continues the trace (a child of this span); written
	// among the runner's own headers, it is never cut to fit.
	own, copied := deadLetterHeaders(ctx, c.Component, code, cause, m.Subject(), m.Headers())
	msgID := ""
	if meta != nil {
		own.Set(HeaderOriginalStream, meta.Stream)
		own.Set(HeaderOriginalSeq, strconv.FormatUint(meta.Sequence.Stream, 10))
		own.Set(HeaderDeliveries, strconv.FormatUint(meta.NumDelivered, 10))
		// The stage is part of the id: stages consuming the same stream
		// each dead-letter their own copy.
		msgID = topology.DeadLetterMsgID(c.Component, meta.Stream, meta.Sequence.Stream)
	}
	hdr, body := fitDeadLetter(own, copied, msgID, m.Data(), c.JS.Conn().MaxPayload())
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := bus.PublishRaw(pctx, c.JS, topology.DLQSubject(c.Component), msgID, body, hdr)
	switch {
	case err == nil:
	case !schemas.Permanent(err) && !lastTry:
		delay := r.backoff(deliveries)
		log.Error("dead-letter publish failed; will retry", "code", code, "err", err, "delay", delay)
		r.retry(ctx, m, delay, log)
		return
	default:
		span.SetAttributes(tracing.AttrOutcome.String(tracing.OutcomeTerm))
		span.SetStatus(codes.Error, "dead letter not stored")
		log.Error("dead letter could not be stored; giving the message up: it stays in its stream, and is not retried",
			"stream", c.Stream, "code", code, "cause", cause, "err", err, "tries", c.DeadLetterTries)
		if terr := m.TermWithReason(string(code) + ": dead letter not stored"); terr != nil {
			log.Warn("term failed; the message will be redelivered", "err", terr)
		}
		return
	}
	span.SetAttributes(tracing.AttrOutcome.String(tracing.OutcomeDeadLetter))
	span.SetStatus(codes.Error, string(code))
	log.Warn("dead-lettered", "code", code, "err", cause)
	c.Metrics.DeadLettered.WithLabelValues(c.Component, string(code)).Inc()
	if err := m.TermWithReason(string(code)); err != nil {
		log.Warn("term failed; a redelivery will be dead-lettered again (deduplicated)", "err", err)
	}
}

// DeadLetterRequest dead-letters a core NATS request that component
// refused as bad input (a request is in no stream, so there is no
// message to terminate): data, the request's headers but its Nats-*
// ones and the runner's own (HeaderStage, HeaderCode, HeaderReason,
// HeaderOriginalSubject; no stream or sequence), cut to fit as a
// consumed message's dead letter is, on tollgate.dlq.<component>, and
// counted in m's DeadLettered. It has no message id: each request is a
// dead letter of its own. Its error is the store's; the caller answers
// the request so that its sender can send it where a consumer will.
func DeadLetterRequest(ctx context.Context, js jetstream.JetStream, m *Metrics, component, subject string, data []byte, reqHdr nats.Header, code schemas.Code, cause error) error {
	own, copied := deadLetterHeaders(ctx, component, code, cause, subject, reqHdr)
	hdr, body := fitDeadLetter(own, copied, "", data, js.Conn().MaxPayload())
	if err := bus.PublishRaw(ctx, js, topology.DLQSubject(component), "", body, hdr); err != nil {
		return err
	}
	if m != nil {
		m.DeadLettered.WithLabelValues(component, string(code)).Inc()
	}
	return nil
}

// deadLetterHeaders are a dead letter's headers before fitDeadLetter: the
// runner's own (the trace context of ctx, HeaderStage, HeaderCode,
// HeaderReason, HeaderOriginalSubject), and the original's but its
// Nats-* ones. Those (message id, expected stream or sequence, TTL,
// rollup...) are directives for the original publish; the server would
// apply them to the dead letter too, and an expectation about another
// stream would make it fail on every retry.
func deadLetterHeaders(ctx context.Context, component string, code schemas.Code, cause error, subject string, original nats.Header) (own, copied nats.Header) {
	own = tracing.Inject(ctx, nats.Header{})
	own.Set(HeaderStage, component)
	own.Set(HeaderCode, string(code))
	own.Set(HeaderReason, truncate(cause.Error(), 1024))
	own.Set(HeaderOriginalSubject, subject)
	copied = nats.Header{}
	for k, v := range original {
		if !strings.HasPrefix(strings.ToLower(k), "nats-") {
			copied[k] = v
		}
	}
	return own, copied
}

// JetStream's limits on one stored message, and the room fitDeadLetter
// keeps for its own marks.
const (
	// maxHeaderBytes: JetStream stores a message's header length in 16
	// bits and refuses a longer header block.
	maxHeaderBytes = math.MaxUint16
	// markBytes is room for HeaderHeadersTruncated and HeaderTruncated.
	markBytes = 128
	// bodyMargin: the encoded header block's own framing may vary slightly.
	bodyMargin = 64
)

// fitDeadLetter returns the headers and body of a dead letter: the
// runner's own headers own (always kept, and winning over an original
// header of the same name), the original's headers copied, the message id
// msgID and the original body data, cut so that it fits both JetStream's
// limit on a header block (maxHeaderBytes) and the payload limit (the
// connection's maxPayload, and the dead-letter stream's message size limit
// schemas.MaxPayloadBytes, as in topology). Without this a message near
// either limit could never be dead-lettered.
//
// What does not fit is cut and marked: copied headers are kept smallest
// first, whole, while the header block fits, and the rest are counted in
// HeaderHeadersTruncated; then, if the body does not fit next to the
// headers, it is cut to its longest prefix that does and HeaderTruncated
// is set to its original size. Neither mark is set when nothing was cut.
func fitDeadLetter(own, copied nats.Header, msgID string, data []byte, maxPayload int64) (nats.Header, []byte) {
	hdr := nats.Header{}
	size := int64(len("NATS/1.0\r\n\r\n"))
	if msgID != "" {
		size += headerBytes(jetstream.MsgIDHeader, []string{msgID})
	}
	for k, vs := range own {
		hdr[k] = vs
		size += headerBytes(k, vs)
	}
	keys := make([]string, 0, len(copied))
	for k := range copied {
		if _, ours := own[k]; !ours {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(headerBytes(a, copied[a]), headerBytes(b, copied[b])), strings.Compare(a, b))
	})
	var droppedKeys, droppedBytes int64
	for _, k := range keys {
		n := headerBytes(k, copied[k])
		if size+n > maxHeaderBytes-markBytes {
			droppedKeys++
			droppedBytes += n
			continue
		}
		hdr[k] = copied[k]
		size += n
	}
	if droppedKeys > 0 {
		v := fmt.Sprintf("%d keys, %d bytes", droppedKeys, droppedBytes)
		hdr.Set(HeaderHeadersTruncated, v)
		size += headerBytes(HeaderHeadersTruncated, []string{v})
	}

	limit := int64(schemas.MaxPayloadBytes)
	if maxPayload > 0 && maxPayload < limit {
		limit = maxPayload
	}
	if size+int64(len(data)) <= limit {
		return hdr, data
	}
	v := strconv.Itoa(len(data))
	hdr.Set(HeaderTruncated, v)
	size += headerBytes(HeaderTruncated, []string{v})
	keep := max(0, min(limit-size-bodyMargin, int64(len(data))))
	return hdr, data[:keep]
}

// headerBytes is the size of header k with values vs in a NATS header
// block ("k: v\r\n" per value), at least what nats.go writes.
func headerBytes(k string, vs []string) int64 {
	n := 0
	for _, v := range vs {
		n += len(k) + len(": ") + len(v) + len("\r\n")
	}
	return int64(n)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
