// Package outcomes hands a reader of turns' outcomes (a chat transport,
// the planner) each turn's outcome once, from where it is kept.
//
// A turn's outcome is made durable by the write that ends its batch: the
// turn log's outcome event, tollgate.turnlog.<i>.<turn>.outcome, whose
// record carries the TurnOutcome (schemas.BatchRecord.Outcome; docs/
// protocol.md §4.2a). A Follower reads those events with one durable
// consumer per turn-log partition, "<Durable>-outcome-<i>" on
// TOLLGATE_TURNLOG_<i> with filter tollgate.turnlog.<i>.*.outcome, each
// driven by a pipeline/runner (explicit acks, retries, dead letters; the
// turn id, not the subject's last token, is the shard key).
//
// The outcome is also published on tollgate.event.turn.outcome.<turn>:
// for every turn while readers move to the logs (issue 36), and for good
// for a turn whose outcome is not in its log (its batch kept in
// tollgate_batches, or ended by an earlier version, whose log's last event
// is named completed or failed and holds no outcome). A reader keeps its
// consumer of the published events and hands each one to Published,
// which passes it on only when the follower's consumers do not deliver
// that turn's outcome:
//
//   - the turn's log holds no outcome event: passed on (the published
//     event is the only copy);
//   - it holds one at a sequence the partition's consumer delivers (at or
//     after the sequence the consumer started at): dropped, the consumer
//     hands it over;
//   - it holds one stored before the consumer started (the stages were
//     upgraded before this reader, and the turn ended in between):
//     passed on.
//
// So every outcome reaches the reader once, whichever version ended the
// turn and in whichever order the stages and the reader were upgraded.
// New creates the consumers it does not find, each starting after its
// partition's last message (DeliverByStartSequence), and reads the start
// of each one back, so that replicas of a reader starting together agree
// on it (the consumer keeps the one of the replica that created it). A
// consumer created otherwise (by hand, with another deliver policy) is
// bound as it is and taken to start where the stream ended when the
// follower started.
//
// The handler gets the outcome as the stage built it: its reply target,
// audience and results come only from a verified TurnContext, so the
// reader needs no keys (batch.Outcome).
package outcomes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// RequestsHandler handles the approvals one turn's move to awaiting
// requested, each the record its approval-requested event announces
// (schemas.BatchRecord.RequestedApprovals); m is the message that carried
// them (the log's awaiting event, or a published approval-requested
// event given to PublishedRequest). Its error is the runner's.
type RequestsHandler func(ctx context.Context, reqs []*schemas.ApprovalRecord, m jetstream.Msg) error

// Handler handles one turn's outcome; m is the message that carried it
// (the log's outcome event, or the published copy given to Published),
// for its metadata (stored time, deliveries). Its error is the runner's to
// act on (pipeline/runner: transient, permanent, Waiting).
type Handler func(ctx context.Context, o *schemas.TurnOutcome, m jetstream.Msg) error

// Config wires a Follower.
type Config struct {
	// Component names the reader (a transport's name, "planner"): the
	// runners' component label and dead-letter subject token.
	Component string
	// Durable is the prefix of the consumers' durable names.
	Durable string
	// Description describes the consumers.
	Description string
	JS          jetstream.JetStream
	Handler     Handler
	Logger      *slog.Logger
	Metrics     *runner.Metrics

	// Optional.
	// Concurrency is each partition's runner's workers (default 1).
	Concurrency int
	// Requests, when set, is handed the approvals each turn's move to
	// awaiting requested: the consumers then follow each partition's
	// awaiting events (tollgate.turnlog.<i>.*.awaiting) as well as its
	// outcome events, so that a turn's requests reach the reader before
	// its outcome (docs/protocol.md §4.2a, "Requests in the log").
	Requests RequestsHandler
	// Wants, when set, tells the turns whose outcomes the reader reads:
	// the events of other turns are acknowledged without being decoded
	// (the planner reads only its step batches').
	Wants func(turn string) bool
	// OnDeadLetter, TracerProvider, MaxAttempts, BaseDelay and MaxDelay
	// are the runners' (runner.Config).
	OnDeadLetter        func(ctx context.Context, m jetstream.Msg, code schemas.Code, cause error) error
	TracerProvider      trace.TracerProvider
	MaxAttempts         int
	BaseDelay, MaxDelay time.Duration
}

// Validate reports what is missing from c.
func (c Config) Validate() error {
	switch {
	case c.Component == "":
		return errors.New("outcomes: no component")
	case c.Durable == "":
		return errors.New("outcomes: no durable name")
	case c.JS == nil:
		return errors.New("outcomes: no JetStream")
	case c.Handler == nil:
		return errors.New("outcomes: no handler")
	case c.Logger == nil:
		return errors.New("outcomes: no logger")
	case c.Metrics == nil:
		return errors.New("outcomes: no runner metrics")
	}
	return nil
}

// Durable is the durable name of prefix's consumer of partition i.
func Durable(prefix string, i int) string { return prefix + "-outcome-" + strconv.Itoa(i) }

// Follower follows the turn logs' outcome events for one reader.
type Follower struct {
	cfg     Config
	streams []jetstream.Stream
	starts  []uint64 // per partition: the first sequence its consumer delivers
	// requestsFrom, per partition, is the first sequence from which its
	// consumer delivers awaiting events (Config.Requests).
	requestsFrom []uint64
	runners      []*runner.Runner
	specs        []topology.ConsumerSpec
}

// RequestsFromKey is the consumer metadata key that records the first
// sequence of its partition from which a reader's consumer delivers
// awaiting events: the sequence after the partition's last message when
// the consumer was created following them, or when a consumer that
// followed outcome events only was extended to follow them too.
const RequestsFromKey = "tollgate_requests_from"

// New binds the turn-log streams (topology.OpenTurnLogs: they must
// exist), creates each partition's consumer unless it exists, reads back
// where it starts, and builds the runners. Nothing is consumed until Run.
func New(ctx context.Context, cfg Config) (*Follower, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	streams, err := topology.OpenTurnLogs(ctx, cfg.JS)
	if err != nil {
		return nil, fmt.Errorf("%s: outcomes: %w", cfg.Component, err)
	}
	f := &Follower{cfg: cfg, streams: streams, starts: make([]uint64, len(streams)), requestsFrom: make([]uint64, len(streams))}
	for i, s := range streams {
		cc, err := f.consumer(ctx, i, s)
		if err != nil {
			return nil, err
		}
		r, err := runner.New(runner.Config{
			Component: cfg.Component, Stream: topology.TurnLogStream(i), Consumer: cc,
			Handler: f.handle, JS: cfg.JS, Logger: cfg.Logger, Metrics: cfg.Metrics,
			Concurrency: cfg.Concurrency, ShardKey: shardKey, OnDeadLetter: cfg.OnDeadLetter, TracerProvider: cfg.TracerProvider,
			MaxAttempts: cfg.MaxAttempts, BaseDelay: cfg.BaseDelay, MaxDelay: cfg.MaxDelay,
		})
		if err != nil {
			return nil, fmt.Errorf("%s: outcomes: %w", cfg.Component, err)
		}
		f.runners = append(f.runners, r)
		f.specs = append(f.specs, topology.ConsumerSpec{Stream: topology.TurnLogStream(i), Config: runner.ConsumerConfig(cc)})
	}
	return f, nil
}

// consumer is partition i's consumer configuration. It creates the
// consumer, starting after the stream's last message, unless it exists;
// an existing consumer (another replica of the reader may have created it
// a moment ago) keeps its start, which is read back.
func (f *Follower) consumer(ctx context.Context, i int, s jetstream.Stream) (jetstream.ConsumerConfig, error) {
	cc := consumerConfig(i, f.cfg.Durable, cmp.Or(f.cfg.Description, "Tollgate "+f.cfg.Component+": turns' outcomes"), f.cfg.Requests != nil)
	existing, last, _, err := ensure(ctx, s, runner.ConsumerConfig(cc))
	if err != nil {
		return cc, fmt.Errorf("%s: outcomes: %w", f.cfg.Component, err)
	}
	have := existing.CachedInfo().Config
	cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
	cc.Metadata = have.Metadata
	f.requestsFrom[i] = requestsFrom(have)
	switch have.DeliverPolicy {
	case jetstream.DeliverByStartSequencePolicy:
		f.starts[i] = cmp.Or(have.OptStartSeq, 1)
	case jetstream.DeliverAllPolicy:
		f.starts[i] = 1
	default: // made otherwise: taken to start now (package doc)
		f.starts[i] = last + 1
	}
	return cc, nil
}

// consumerConfig is the consumer of partition i's outcome events (and,
// with requests, its awaiting events) named for prefix, before its start
// is known.
func consumerConfig(i int, prefix, description string, requests bool) jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       Durable(prefix, i),
		Description:   description,
		FilterSubject: topology.TurnLogOutcomeFilter(i),
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
	}
	if requests {
		cc.FilterSubject, cc.FilterSubjects = "", []string{topology.TurnLogOutcomeFilter(i), topology.TurnLogAwaitingFilter(i)}
	}
	return cc
}

// FollowsRequests reports whether consumer configuration cc follows its
// partition's awaiting events.
func FollowsRequests(cc jetstream.ConsumerConfig) bool {
	return slices.ContainsFunc(append([]string{cc.FilterSubject}, cc.FilterSubjects...), func(f string) bool {
		return strings.HasPrefix(f, topology.SubjectTurnLogPrefix) && strings.HasSuffix(f, ".*."+store.EventAwaiting)
	})
}

// requestsFrom is the first sequence from which consumer configuration
// cc delivers awaiting events (RequestsFromKey): 0 when it follows none;
// the largest sequence there is when it follows them but does not say
// from where (a published request is then always handed over: at worst
// twice, never lost).
func requestsFrom(cc jetstream.ConsumerConfig) uint64 {
	if !FollowsRequests(cc) {
		return 0
	}
	if n, err := strconv.ParseUint(cc.Metadata[RequestsFromKey], 10, 64); err == nil && n > 0 {
		return n
	}
	return math.MaxUint64
}

// ensure creates cc's consumer on s, starting after s's last message,
// unless it exists, and returns the consumer as the server has it, the
// stream's last sequence when it looked, and whether this call created
// it. An existing consumer is left as it is, except that one cc wants to
// follow awaiting events too, which does not yet, is extended to (extend).
func ensure(ctx context.Context, s jetstream.Stream, cc jetstream.ConsumerConfig) (_ jetstream.Consumer, last uint64, created bool, _ error) {
	info, err := s.Info(ctx)
	if err != nil {
		return nil, 0, false, fmt.Errorf("stream of %s: %w", cc.Durable, err)
	}
	last = info.State.LastSeq
	existing, err := s.Consumer(ctx, cc.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cc.OptStartSeq = last + 1
		if FollowsRequests(cc) {
			cc.Metadata = map[string]string{RequestsFromKey: strconv.FormatUint(last+1, 10)}
		}
		existing, err = s.CreateConsumer(ctx, cc)
		created = err == nil
		if errors.Is(err, jetstream.ErrConsumerExists) {
			existing, err = s.Consumer(ctx, cc.Durable)
		}
	}
	if err == nil && FollowsRequests(cc) && !FollowsRequests(existing.CachedInfo().Config) {
		existing, err = extend(ctx, s, existing.CachedInfo().Config, cc.FilterSubjects)
	}
	if err != nil {
		return nil, 0, false, fmt.Errorf("consumer %s: %w", cc.Durable, err)
	}
	return existing, last, created, nil
}

// extend makes consumer have, which follows its partition's outcome
// events only, follow filters (its outcome and awaiting events) from
// where it is, then records in its metadata the partition's last sequence
// after the change, plus one (RequestsFromKey). An awaiting event stored
// before that mark may reach the reader twice (through the consumer, if
// it had not passed it, and through its published copy), never not at
// all; a change interrupted before the mark leaves none, and requestsFrom
// then hands every published request over.
func extend(ctx context.Context, s jetstream.Stream, have jetstream.ConsumerConfig, filters []string) (jetstream.Consumer, error) {
	have.FilterSubject, have.FilterSubjects = "", filters
	if _, err := s.UpdateConsumer(ctx, have); err != nil {
		return nil, fmt.Errorf("follow awaiting events too: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	have.Metadata = maps.Clone(have.Metadata)
	if have.Metadata == nil {
		have.Metadata = map[string]string{}
	}
	have.Metadata[RequestsFromKey] = strconv.FormatUint(info.State.LastSeq+1, 10)
	return s.UpdateConsumer(ctx, have)
}

// CheckPrefix reports whether prefix can name a reader's consumers
// (Durable(prefix, i) is a valid durable name).
func CheckPrefix(prefix string) error {
	if prefix == "" || !schemas.ValidKey(Durable(prefix, 0)) {
		return fmt.Errorf("outcomes: %q is not a durable name prefix", prefix)
	}
	return nil
}

// EnsureConsumers creates, for a reader of outcomes that does not create
// its own consumers (a transport whose user may only pull them, as
// deploy/nats's example transport "cli"), one durable pull consumer per
// turn-log partition: Durable(prefix, i) on TOLLGATE_TURNLOG_<i>, filter
// tollgate.turnlog.<i>.*.outcome, explicit acks, starting after the
// partition's last message when it is created. A consumer that exists is
// left as it is. It reports the names of those it created. The reader
// then follows docs/protocol.md §4.2a, "Following outcomes", as a Follower
// does (`tollgate provision --outcome-reader <prefix>` calls it).
func EnsureConsumers(ctx context.Context, js jetstream.JetStream, prefix string) ([]string, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, err
	}
	streams, err := topology.OpenTurnLogs(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("outcomes: %w", err)
	}
	var created []string
	for i, s := range streams {
		cc := consumerConfig(i, prefix, "Tollgate reader "+prefix+": turns' requests and outcomes", true)
		_, _, made, err := ensure(ctx, s, cc)
		if err != nil {
			return created, fmt.Errorf("outcomes: %w", err)
		}
		if made {
			created = append(created, topology.TurnLogStream(i)+"/"+cc.Durable)
		}
	}
	return created, nil
}

// Turn is the turn id of an outcome or awaiting event's subject, "" for
// any other subject: for a reader's dead-letter hook
// (Config.OnDeadLetter).
func Turn(subject string) string {
	if _, turn, event, ok := topology.ParseTurnLogSubject(subject); ok && (event == store.EventOutcome || event == store.EventAwaiting) {
		return turn
	}
	return ""
}

// shardKey is the turn id of a turn-log subject.
func shardKey(m jetstream.Msg) string {
	if _, turn, _, ok := topology.ParseTurnLogSubject(m.Subject()); ok {
		return turn
	}
	return m.Subject()
}

// handle decodes an outcome event and hands its outcome over, or an
// awaiting event and hands its requests over.
func (f *Follower) handle(ctx context.Context, m jetstream.Msg) error {
	_, turn, event, ok := topology.ParseTurnLogSubject(m.Subject())
	if !ok || event != store.EventOutcome && (event != store.EventAwaiting || f.cfg.Requests == nil) {
		return schemas.Errorf(schemas.CodeUnknownMessage, "%s: %s is not a turn's outcome event", f.cfg.Component, m.Subject())
	}
	if f.cfg.Wants != nil && !f.cfg.Wants(turn) {
		return nil
	}
	if event == store.EventAwaiting {
		reqs, err := store.DecodeRequested(turn, m.Data())
		if err != nil || len(reqs) == 0 {
			return err // none: an earlier version's event, its requests published (PublishedRequest)
		}
		return f.cfg.Requests(ctx, reqs, m)
	}
	o, err := store.DecodeOutcome(turn, m.Data())
	if errors.Is(err, store.ErrNoOutcome) {
		return nil // its published outcome is the one read (Published)
	}
	if err != nil {
		return err
	}
	return f.cfg.Handler(ctx, o, m)
}

// Published hands o, an outcome published on
// tollgate.event.turn.outcome (m, its message), to the handler unless the
// follower's consumers deliver that turn's outcome from its log (the
// package doc). Its error is transient (the log could not be read) or the
// handler's.
func (f *Follower) Published(ctx context.Context, o *schemas.TurnOutcome, m jetstream.Msg) error {
	logged, err := f.Delivers(ctx, o.TurnID)
	if err != nil || logged {
		return err
	}
	return f.cfg.Handler(ctx, o, m)
}

// Delivers reports whether the follower's consumer of turn's partition
// delivers turn's outcome: whether its log holds an outcome event that
// keeps the outcome (store.LoggedOutcome) at or after the sequence that consumer
// starts at.
func (f *Follower) Delivers(ctx context.Context, turn string) (bool, error) {
	seq, ok, err := store.LoggedOutcome(ctx, f.streams, turn)
	if err != nil {
		return false, fmt.Errorf("%s: %w", f.cfg.Component, err)
	}
	return ok && seq >= f.starts[topology.TurnLogPartition(turn, len(f.streams))], nil
}

// PublishedRequest hands rec, an approval request published on
// tollgate.event.approval.requested (m, its message), to Config.Requests
// unless the follower's consumers deliver it from its turn's log: its
// log's awaiting event keeps it, at or after the sequence from which the
// consumer of its partition delivers awaiting events. Its error is
// transient (the log could not be read) or the handler's. Without
// Config.Requests it does nothing.
func (f *Follower) PublishedRequest(ctx context.Context, rec *schemas.ApprovalRecord, m jetstream.Msg) error {
	if f.cfg.Requests == nil {
		return nil
	}
	logged, err := f.DeliversRequest(ctx, rec.TurnID, rec.ApprovalID)
	if err != nil || logged {
		return err
	}
	return f.cfg.Requests(ctx, []*schemas.ApprovalRecord{rec}, m)
}

// DeliversRequest reports whether the follower's consumer of turn's
// partition delivers the request of approval id: whether turn's log's
// awaiting event keeps it (store.LoggedRequest) at or after the sequence
// from which that consumer delivers awaiting events.
func (f *Follower) DeliversRequest(ctx context.Context, turn, id string) (bool, error) {
	if f.cfg.Requests == nil {
		return false, nil
	}
	seq, ok, err := store.LoggedRequest(ctx, f.streams, turn, id)
	if err != nil {
		return false, fmt.Errorf("%s: %w", f.cfg.Component, err)
	}
	return ok && seq >= f.requestsFrom[topology.TurnLogPartition(turn, len(f.streams))], nil
}

// Run consumes every partition until ctx is cancelled (runner.RunAll).
func (f *Follower) Run(ctx context.Context) error { return runner.RunAll(ctx, f.runners...) }

// Runners are the partitions' runners, for a reader that runs them with
// its other consumers' (runner.RunAll).
func (f *Follower) Runners() []*runner.Runner { return slices.Clone(f.runners) }

// Ready is nil when every partition's runner consumes.
func (f *Follower) Ready() error {
	var errs []error
	for _, r := range f.runners {
		errs = append(errs, r.Ready())
	}
	return errors.Join(errs...)
}

// Consumers are the follower's consumers, one per partition, as it runs
// them (the runner adds its settings: runner.ConsumerConfig).
func (f *Follower) Consumers() []topology.ConsumerSpec { return f.specs }
