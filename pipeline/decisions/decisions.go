// Package decisions hands a reader of approvals' decisions (a chat
// transport closing its prompts, a webhook subscriber) each decision once,
// from where it is made durable: the revision of the approval's record in
// KV tollgate_approvals that holds it decided (approved, denied, expired
// or abandoned), a message of the bucket's stream KV_tollgate_approvals on
// $KV.tollgate_approvals.<approval id> (topology.StreamApprovals,
// topology.ApprovalRevisionSubject; docs/protocol.md, issue 36).
//
// A Follower reads that stream with one durable pull consumer of the
// reader's, Durable(prefix) ("<prefix>-decided"), filtered to every
// approval's revisions (topology.ApprovalRevisions), driven by a
// pipeline/runner: explicit acks, NakWithDelay between attempts, dead
// letter then TermWithReason, a recovered panic dead-lettered with
// HANDLER_PANIC; the approval id, the subject's last token, is the shard
// key, so one approval's revisions are handled one at a time. Each
// revision is projected with store.DecidedOf: a decided record is handed
// to the Handler as the DecidedEvent the approver publishes for that
// decision (decoded from its encoding, so byte for byte the event a
// reader of the published copy decodes; Repeat empty); every other
// revision (a pending record, a vote, a delete or purge marker, a retire
// rewrite) is acknowledged and passed over, and so is one that does not
// decode or names another approval than its subject (logged, never
// guessed at). The bucket keeps one revision per key and a decided record
// is never changed again, so each decision reaches the handler once
// (again only on a redelivery: the handler must be idempotent).
//
// Where the consumer starts when New creates it (Config.From):
//
//   - FromAll (DeliverAll): every decision whose record the bucket still
//     holds, then each new one. A reader made or upgraded later still
//     hears every retained decision, whatever it missed and in whatever
//     order it and the stages were upgraded; a reader whose acting is
//     idempotent and cheap to repeat (a chat transport: a prompt closed
//     once is found closed) takes this.
//   - FromNow: after the stream's last message (DeliverByStartSequence),
//     for a reader that must not act on the past (a new webhook
//     subscriber receives what happens after it is made). A decision
//     recorded before that is taken from its published copy, if the
//     reader reads those (Published).
//
// An existing consumer is bound as it is and its start read back, so that
// replicas of a reader starting together agree on it (the consumer keeps
// the one of the replica that created it); one created otherwise (by hand,
// with another deliver policy) is taken to start where the stream ended
// when the follower started.
//
// The approver also publishes each decision on
// tollgate.event.approval.decided.<turn> while readers move to the
// bucket; later it publishes there only its answer to a decision that
// repeated the recorded one (DecidedEvent.Repeat set). A reader of those
// events hands each to Published, which passes it on only when the
// follower's consumer does not deliver that decision: never an event that
// carries Repeat (it repeats a recorded decision), and an event without
// it only when the bucket holds no revision of that decision the consumer
// delivers (Delivers). So every decision reaches the reader once,
// whichever copy exists.
package decisions

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Handler handles one approval's decision; m is the message that carried
// it (the decided revision in KV_tollgate_approvals, or the published
// event given to Published), for its metadata (stored time, deliveries).
// Its error is the runner's to act on (pipeline/runner: transient,
// permanent, Waiting).
type Handler func(ctx context.Context, ev *schemas.DecidedEvent, m jetstream.Msg) error

// From is where a consumer New creates starts (the package doc).
type From int

const (
	// FromAll delivers every decision the bucket holds (DeliverAll).
	FromAll From = iota
	// FromNow delivers the decisions recorded after the consumer was
	// created.
	FromNow
)

// Config wires a Follower.
type Config struct {
	// Component names the reader (a transport's name, "webhook.<id>"):
	// the runner's component label and dead-letter subject token.
	Component string
	// Durable is the consumer's durable name (Durable(prefix)).
	Durable string
	// Description describes the consumer.
	Description string
	JS          jetstream.JetStream
	Handler     Handler
	Logger      *slog.Logger
	Metrics     *runner.Metrics

	// Optional.
	// From is where a consumer New creates starts (default FromAll).
	From From
	// Concurrency is the runner's workers (default 1).
	Concurrency int
	// MaxAckPending bounds the decisions handed out and not yet settled
	// (default the runner's, 1024; 1: one at a time, in stream order).
	MaxAckPending int
	// OnDeadLetter, TracerProvider, MaxAttempts, BaseDelay and MaxDelay
	// are the runner's (runner.Config).
	OnDeadLetter        func(ctx context.Context, m jetstream.Msg, code schemas.Code, cause error) error
	TracerProvider      trace.TracerProvider
	MaxAttempts         int
	BaseDelay, MaxDelay time.Duration
}

// Validate reports what is missing from c.
func (c Config) Validate() error {
	switch {
	case c.Component == "":
		return errors.New("decisions: no component")
	case c.Durable == "" || !schemas.ValidKey(c.Durable):
		return fmt.Errorf("decisions: %q is not a durable name", c.Durable)
	case c.JS == nil:
		return errors.New("decisions: no JetStream")
	case c.Handler == nil:
		return errors.New("decisions: no handler")
	case c.Logger == nil:
		return errors.New("decisions: no logger")
	case c.Metrics == nil:
		return errors.New("decisions: no runner metrics")
	case c.From != FromAll && c.From != FromNow:
		return fmt.Errorf("decisions: unknown start %d", c.From)
	}
	return nil
}

// Durable is the durable name of the decisions consumer of the reader
// whose consumers are named with prefix ("transport-slack",
// "webhook-<id>"): "<prefix>-decided".
func Durable(prefix string) string { return prefix + "-decided" }

// Follower follows the approvals bucket's stream for one reader.
type Follower struct {
	cfg    Config
	stream jetstream.Stream
	start  uint64 // the first sequence its consumer delivers
	runner *runner.Runner
	spec   topology.ConsumerSpec
}

// New binds the approvals bucket's stream (it must exist: topology.Ensure),
// creates the consumer unless it exists, reads back where it starts, and
// builds the runner. Nothing is consumed until Run.
func New(ctx context.Context, cfg Config) (*Follower, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := cfg.JS.Stream(ctx, topology.StreamApprovals)
	if err != nil {
		return nil, fmt.Errorf("%s: decisions: stream %s: %w", cfg.Component, topology.StreamApprovals, err)
	}
	f := &Follower{cfg: cfg, stream: s}
	cc, err := f.consumer(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: decisions: %w", cfg.Component, err)
	}
	f.runner, err = runner.New(runner.Config{
		Component: cfg.Component, Stream: topology.StreamApprovals, Consumer: cc,
		Handler: f.handle, JS: cfg.JS, Logger: cfg.Logger, Metrics: cfg.Metrics,
		Concurrency: cfg.Concurrency, OnDeadLetter: cfg.OnDeadLetter, TracerProvider: cfg.TracerProvider,
		MaxAttempts: cfg.MaxAttempts, BaseDelay: cfg.BaseDelay, MaxDelay: cfg.MaxDelay,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: decisions: %w", cfg.Component, err)
	}
	f.spec = topology.ConsumerSpec{Stream: topology.StreamApprovals, Config: runner.ConsumerConfig(cc)}
	return f, nil
}

// ConsumerConfig is the consumer named durable of every approval's
// revisions, as a Follower creates it with from (before a FromNow
// consumer's start sequence is known), one at a time when maxAckPending
// is 1 (0: the runner's default).
func ConsumerConfig(durable, description string, from From, maxAckPending int) jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       durable,
		Description:   description,
		FilterSubject: topology.ApprovalRevisions,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: maxAckPending,
	}
	if from == FromNow {
		cc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
	}
	return cc
}

// consumer creates the consumer unless it exists and returns its
// configuration with its start as the server has it; f.start is set.
func (f *Follower) consumer(ctx context.Context) (jetstream.ConsumerConfig, error) {
	cc := ConsumerConfig(f.cfg.Durable, cmp.Or(f.cfg.Description, "Tollgate "+f.cfg.Component+": approvals' decisions"), f.cfg.From, f.cfg.MaxAckPending)
	existing, last, _, err := ensure(ctx, f.stream, cc)
	if err != nil {
		return cc, err
	}
	have := existing.CachedInfo().Config
	cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
	switch have.DeliverPolicy {
	case jetstream.DeliverByStartSequencePolicy:
		f.start = cmp.Or(have.OptStartSeq, 1)
	case jetstream.DeliverAllPolicy:
		f.start = 1
	default: // made otherwise: taken to start now (package doc)
		f.start = last + 1
	}
	return cc, nil
}

// ensure creates cc's consumer on s (runner.ConsumerConfig; a
// DeliverByStartSequence one after s's last message) unless it exists,
// and returns the consumer as the server has it, the stream's last
// sequence when it looked, and whether this call created it. An existing
// consumer is left as it is.
func ensure(ctx context.Context, s jetstream.Stream, cc jetstream.ConsumerConfig) (_ jetstream.Consumer, last uint64, created bool, _ error) {
	info, err := s.Info(ctx)
	if err != nil {
		return nil, 0, false, fmt.Errorf("stream %s: %w", topology.StreamApprovals, err)
	}
	last = info.State.LastSeq
	existing, err := s.Consumer(ctx, cc.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		create := runner.ConsumerConfig(cc)
		if create.DeliverPolicy == jetstream.DeliverByStartSequencePolicy {
			create.OptStartSeq = last + 1
		}
		existing, err = s.CreateConsumer(ctx, create)
		created = err == nil
		if errors.Is(err, jetstream.ErrConsumerExists) {
			existing, err = s.Consumer(ctx, cc.Durable)
		}
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("consumer %s: %w", cc.Durable, err)
	}
	return existing, last, created, nil
}

// EnsureConsumer creates, for a reader of decisions that does not create
// its own consumers (a transport whose user may only pull them), the
// durable consumer a Follower with durable and from would make on
// KV_tollgate_approvals (ConsumerConfig, with the runner's settings:
// explicit acks, AckWait 30s, no MaxDeliver), unless it exists, and
// reports whether it created it. A consumer that exists is left as it
// is.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, durable string, from From, maxAckPending int) (bool, error) {
	if !schemas.ValidKey(durable) {
		return false, fmt.Errorf("decisions: %q is not a durable name", durable)
	}
	s, err := js.Stream(ctx, topology.StreamApprovals)
	if err != nil {
		return false, fmt.Errorf("decisions: stream %s: %w", topology.StreamApprovals, err)
	}
	_, _, created, err := ensure(ctx, s, ConsumerConfig(durable, "Tollgate reader "+durable+": approvals' decisions", from, maxAckPending))
	if err != nil {
		return false, fmt.Errorf("decisions: %w", err)
	}
	return created, nil
}

// handle projects one revision and hands a decision over.
func (f *Follower) handle(ctx context.Context, m jetstream.Msg) error {
	ev, err := store.DecidedOf(m.Subject(), m.Headers(), m.Data())
	if err == nil && ev != nil {
		ev, err = asPublished(ev)
	}
	if err != nil {
		f.cfg.Logger.Warn("decisions: a revision of the approvals bucket that is no decision it can read: passed over",
			"subject", m.Subject(), "code", schemas.CodeOf(err), "err", err)
		return nil
	}
	if ev == nil {
		return nil // a pending record, a vote, a marker, a rewrite
	}
	return f.cfg.Handler(ctx, ev, m)
}

// asPublished is ev as a reader of its published copy decodes it (its
// version stamped, its times as the wire carries them).
func asPublished(ev *schemas.DecidedEvent) (*schemas.DecidedEvent, error) {
	b, err := schemas.Encode(ev)
	if err != nil {
		return nil, err
	}
	return schemas.Decode[schemas.DecidedEvent](b)
}

// Published hands ev, a decided event published on
// tollgate.event.approval.decided (m, its message), to the handler unless
// the follower's consumer delivers that decision (the package doc): an
// event that carries Repeat never; one that does not, only when Delivers
// says no. Its error is transient (the bucket could not be read) or the
// handler's.
func (f *Follower) Published(ctx context.Context, ev *schemas.DecidedEvent, m jetstream.Msg) error {
	if ev.Repeat != "" {
		return nil // the answer to a repeated decision: the decision is recorded
	}
	delivers, err := f.Delivers(ctx, ev.ApprovalID)
	if err != nil || delivers {
		return err
	}
	return f.cfg.Handler(ctx, ev, m)
}

// KV-Operation, the header of a delete or purge marker in a bucket.
const kvOperationHeader = "KV-Operation"

// Delivers reports whether the follower's consumer delivers the decision
// of approval id: yes when the bucket holds the approval still pending (its
// decision, when it comes, is a later revision), or decided at or after
// the sequence the consumer starts at; no when it holds no revision of the
// approval (past retention, never written), a delete or purge marker, a
// retire rewrite (the decision it repeats may be older than the start: at
// worst the decision is handed over twice, never not at all), a revision
// that does not decode, or a decision recorded before the consumer's
// start. An error reading the bucket is transient.
func (f *Follower) Delivers(ctx context.Context, id string) (bool, error) {
	if !schemas.ValidKey(id) {
		return false, nil
	}
	m, err := f.stream.GetLastMsgForSubject(ctx, topology.ApprovalRevisionSubject(id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%s: decisions: the record of approval %s: %w", f.cfg.Component, id, err)
	case m.Header.Get(kvOperationHeader) != "" || m.Header.Get(store.RewriteHeader) != "":
		return false, nil
	}
	ev, err := store.DecidedOf(m.Subject, m.Header, m.Data)
	switch {
	case err != nil:
		return false, nil
	case ev == nil:
		return true, nil // pending
	}
	return m.Sequence >= f.start, nil
}

// Decision is the sequence of the revision that holds the decision of
// approval id, when the follower's consumer delivers it (0 when it does
// not: the approval is still pending, has no revision, or was decided
// before the consumer's start). For a retire rewrite at or after the
// start it is the rewrite's sequence (the decision is at or before it):
// a reader that waits for the consumer to pass it (Passed) waits at worst
// a little longer. An error reading the bucket is transient.
func (f *Follower) Decision(ctx context.Context, id string) (uint64, error) {
	if !schemas.ValidKey(id) {
		return 0, nil
	}
	m, err := f.stream.GetLastMsgForSubject(ctx, topology.ApprovalRevisionSubject(id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("%s: decisions: the record of approval %s: %w", f.cfg.Component, id, err)
	case m.Sequence < f.start || m.Header.Get(kvOperationHeader) != "":
		return 0, nil
	case m.Header.Get(store.RewriteHeader) != "":
		return m.Sequence, nil
	}
	if ev, err := store.DecidedOf(m.Subject, m.Header, m.Data); err != nil || ev == nil {
		return 0, nil
	}
	return m.Sequence, nil
}

// Passed reports whether the follower's consumer has passed the stream's
// message seq: its ack floor has reached it (handed over and settled, or
// passed over). An error reading the consumer is transient.
func (f *Follower) Passed(ctx context.Context, seq uint64) (bool, error) {
	c, err := f.stream.Consumer(ctx, f.cfg.Durable)
	if err != nil {
		return false, fmt.Errorf("%s: decisions: consumer %s: %w", f.cfg.Component, f.cfg.Durable, err)
	}
	return c.CachedInfo().AckFloor.Stream >= seq, nil
}

// Start is the first sequence of KV_tollgate_approvals the follower's
// consumer delivers.
func (f *Follower) Start() uint64 { return f.start }

// Run consumes until ctx is cancelled (runner.Runner.Run).
func (f *Follower) Run(ctx context.Context) error { return f.runner.Run(ctx) }

// Runner is the follower's runner, for a reader that runs it with its
// other consumers' (runner.RunAll).
func (f *Follower) Runner() *runner.Runner { return f.runner }

// Ready is nil while the follower's runner consumes.
func (f *Follower) Ready() error { return f.runner.Ready() }

// Consumer is the follower's consumer as it runs it (the runner adds its
// settings: runner.ConsumerConfig).
func (f *Follower) Consumer() topology.ConsumerSpec { return f.spec }
