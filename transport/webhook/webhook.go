// Package webhook sends Tollgate's events to HTTP receivers: outgoing
// webhooks, signed per the Standard Webhooks specification.
//
// Each subscriber (Config.Subscribers) has its own durable JetStream
// consumer, webhook-<id>, on TOLLGATE_EVENTS, filtered to the events it
// asked for, driven by the stages' runner (pipeline/runner): explicit acks,
// NakWithDelay between attempts, dead letter then TermWithReason. So:
//
//   - Nothing is lost while the dispatcher is down: the consumer keeps its
//     place in the stream (events are kept 30 days) and delivery resumes
//     where it stopped. A new subscriber starts with the events stored
//     after its consumer was first created; a consumer nobody has read for
//     the stream's max age (30 days) is removed by the server.
//   - Delivery is at least once. Receivers dedupe by the webhook-id header:
//     the event's Nats-Msg-Id on TOLLGATE_EVENTS, the one it has or, kept
//     only in a turn log or the approvals bucket, would have
//     (requested:<approval>, decided:<approval>, outcome:<turn>), the same
//     for every attempt and every subscriber.
//   - Turns' approval requests and outcomes are read where the turn logs
//     keep them (docs/protocol.md §4.2a): a request in the log's awaiting
//     event (the move that made the batch wait), an outcome in its outcome
//     event. Each subscriber that asks for approval.requested or outcome
//     also has a follower of the logs (pipeline/outcomes), one durable per
//     partition, webhook-<id>-outcome-<i>, made when the dispatcher starts
//     (after each partition's last message), following the awaiting events
//     too when it asks for requests. A request or outcome also published
//     on TOLLGATE_EVENTS (a turn an earlier version moved on, or kept in
//     tollgate_batches; and, while the publish lasts, every turn) is sent
//     from its published copy only when the log does not deliver it: each
//     is sent once, with the same webhook-id and body either way.
//   - Approvals' decisions are read where the approvals bucket keeps them
//     (issue 36): an approval's decision is the revision of its record in
//     KV tollgate_approvals that holds it decided. Each subscriber that
//     asks for approval.decided has a durable consumer of the bucket's
//     stream KV_tollgate_approvals (pipeline/decisions),
//     webhook-<id>-decided, made when the dispatcher starts (after the
//     stream's last message), which sends each decision as the
//     approval.decided event the approver published for it: the same
//     webhook-id (decided:<approval>) and data, byte for byte; its
//     timestamp is when the revision was stored. A decided event published
//     on TOLLGATE_EVENTS is sent only when that consumer does not deliver
//     its decision (recorded before the consumer was made: a subscriber
//     that read the published events before the upgrade, whose events
//     consumer still holds some); one that carries repeat, the approver's
//     answer to a decision that repeated the recorded one, never (the
//     subscriber got the decision). Each decision is sent once.
//   - Order: the events consumer sends one event at a time, in stream
//     order (it allows one unacknowledged message), and so does the
//     decisions consumer; each log consumer one event of its partition at
//     a time, a turn's in log order while they succeed. Across consumers:
//     a turn's approval.decided, and its outcome, are sent only once the
//     turn's request (for an outcome, its requests) has been passed by the
//     consumer that delivers it (its ack floor has reached the request: a
//     log consumer the turn's awaiting event, the events consumer the
//     published request; delivered, or given up and dead-lettered). The
//     event waits for that a while (requestFirst: an attempt's timeout
//     plus requestGrace; ackSettle for a logged outcome, which holds its
//     turn in that consumer), then sends the request itself first, as
//     part of its own attempt (the receiver dedupes the second copy by
//     webhook-id), so no two consumers can wait on each other for good. A
//     decision recorded before its turn's batch moved to awaiting (an
//     approval a standing grant decided as it was created) first waits,
//     for as long past the decision, for that move. A turn's outcome is
//     also sent only once the events consumer has passed every event of
//     the turn the subscriber follows, and the decisions consumer every
//     decision of the turn's approvals (named by its results) recorded
//     when the outcome is sent (their ack floors have reached the last
//     such). So a turn's approval.requested, approval.decided and outcome
//     arrive in that order, across restarts and across several
//     dispatchers sharing the consumers. Events of different turns may
//     arrive in another order than they happened, up to one from the
//     events consumer, one from the decisions consumer and one per
//     partition at once. The price is head-of-line blocking: while an
//     event is being retried, those that must come after it wait: the
//     subscriber's later events on the same consumer, its turn's later
//     events on the others (other subscribers are not held up).
//   - A 2xx answer is delivered. 410 Gone is not retried: the event is
//     dead-lettered at once (the receiver said it wants no more; remove the
//     subscriber from the configuration). Any other answer, a 3xx
//     (redirects are never followed), a timeout or a connection failure is
//     retried on Config.Retry's schedule; after the last attempt the event
//     is dead-lettered on tollgate.dlq.webhook.<id> with code
//     WEBHOOK_UNDELIVERABLE (original bytes and headers, as every dead
//     letter: docs/protocol.md §8; for an event read from a turn log, the
//     log's event, which may hold several requests; for a decision, its
//     revision in the approvals bucket, the decided ApprovalRecord) and
//     terminated for that subscriber.
//   - An event that does not decode is dead-lettered with its decoding
//     code, never sent. An outcome that goes nowhere (empty audience: no
//     verified context, docs/protocol.md §6 TurnOutcome) is sent to nobody.
//
// The request: POST, Content-Type application/json, headers webhook-id,
// webhook-timestamp (Unix seconds of the attempt) and webhook-signature
// ("v1," + base64 of HMAC-SHA256 over "<id>.<timestamp>.<body>" keyed with
// the secret's decoded bytes), and the subscriber's own headers. The body
// is {"type": <event>, "timestamp": <RFC 3339 time the event was stored
// (a request kept in a turn log: its awaiting event's)>, "data": <the
// event record with its wire keys, docs/protocol.md §6>}. (A decision
// kept in the approvals bucket: the time its revision was stored.)
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/decisions"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Component is subscriber id's name in the runner
// (runner.Config.Component): "webhook.<id>", its dead-letter subject
// (tollgate.dlq.webhook.<id>, so that one NATS grant,
// tollgate.dlq.webhook.>, covers every subscriber's), its Tollgate-Stage
// header and its "stage" label in the runner's metrics.
func Component(id string) string { return "webhook." + id }

// Durable is the name of subscriber id's durable consumer on
// TOLLGATE_EVENTS: "webhook-<id>" (a consumer name has no '.').
func Durable(id string) string { return "webhook-" + id }

// DecidedDurable is the name of subscriber id's durable consumer of the
// approvals' decisions on KV_tollgate_approvals: "webhook-<id>-decided"
// (decisions.Durable).
func DecidedDurable(id string) string { return decisions.Durable(Durable(id)) }

// Delivery results, the result label of tollgate_webhook_deliveries_total.
const (
	ResultDelivered     = "delivered"     // a 2xx answer
	ResultFailed        = "failed"        // no 2xx; the event will be sent again
	ResultUndeliverable = "undeliverable" // no 2xx on the last attempt, or 410 Gone: dead-lettered
)

// Dispatcher delivers events to the configured subscribers.
type Dispatcher struct {
	js      jetstream.JetStream
	cfg     Config
	metrics *runner.Metrics
	subs    []*subscriber
	runners []*runner.Runner

	mu      sync.Mutex
	running []*runner.Runner // Run's: the events consumers', the outcome followers' and the decisions followers'
}

// Ready is nil once every subscriber's consumers consume (Run has made
// them: events consumers, turn-log followers and decisions followers
// alike): events stored from then on reach every subscriber.
func (d *Dispatcher) Ready() error {
	d.mu.Lock()
	running := d.running
	d.mu.Unlock()
	if len(d.runners) > 0 && running == nil {
		return errors.New("webhook: not running")
	}
	var errs []error
	for _, r := range running {
		errs = append(errs, r.Ready())
	}
	return errors.Join(errs...)
}

// New validates cfg and builds a dispatcher on js. Nothing touches the
// server until Run. The events and dead-letter streams must exist when Run
// starts (topology.Ensure, which every stage runs).
func New(js jetstream.JetStream, cfg Config) (*Dispatcher, error) {
	if js == nil {
		return nil, errors.New("webhook: a JetStream client is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	cfg = cfg.withDefaults()
	deliveries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_webhook_deliveries_total",
		Help: "Webhook delivery attempts by subscriber and result (delivered, failed, undeliverable).",
	}, []string{"subscriber", "result"})
	if err := metrics.Register(cfg.Registerer, &deliveries); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	client := &http.Client{}
	if cfg.Client != nil {
		c := *cfg.Client
		client = &c
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	approvals := &approvalBucket{js: js}
	rm := runner.NewMetrics(cfg.Registerer)

	d := &Dispatcher{js: js, cfg: cfg, metrics: rm}
	for _, s := range cfg.Subscribers {
		key, _ := secretKey(s.Secret) // checked by Validate
		sub := &subscriber{
			id: s.ID, url: s.URL, key: key, headers: http.Header{},
			transports: set(s.Transports), sessions: set(s.Sessions),
			client: client, timeout: cfg.Timeout, attempts: cfg.Retry.Attempts, requestWait: cfg.Timeout + requestGrace,
			approvals: approvals, log: cfg.Logger,
			delivered:     deliveries.WithLabelValues(s.ID, ResultDelivered),
			failed:        deliveries.WithLabelValues(s.ID, ResultFailed),
			undeliverable: deliveries.WithLabelValues(s.ID, ResultUndeliverable),
		}
		for k, v := range s.Headers {
			sub.headers.Set(k, v)
		}
		cc := consumer(s)
		sub.consumer = runner.ConsumerConfig(cc)
		sub.follows = cc.FilterSubjects
		sub.outcomes = slices.Contains(cc.FilterSubjects, subjectPrefix[EventOutcome]+"*")
		sub.requests = slices.Contains(cc.FilterSubjects, subjectPrefix[EventApprovalRequested]+"*")
		sub.decided = slices.Contains(cc.FilterSubjects, subjectPrefix[EventApprovalDecided]+"*")
		d.subs = append(d.subs, sub)
		name := Component(s.ID)
		r, err := runner.New(runner.Config{
			Component: name, Stream: topology.StreamEvents, Consumer: cc,
			Handler: sub.handle, JS: js, Logger: cfg.Logger.With("stage", name), Metrics: rm,
			MaxAttempts: cfg.Retry.Attempts, BaseDelay: cfg.Retry.Base, MaxDelay: cfg.Retry.Max,
			Concurrency: 1,
		})
		if err != nil {
			return nil, fmt.Errorf("webhook: subscriber %q: %w", s.ID, err)
		}
		d.runners = append(d.runners, r)
	}
	return d, nil
}

// consumer is subscriber s's durable consumer on TOLLGATE_EVENTS. It
// follows approval.decided too when s asks for it: for the decisions
// recorded before s's decisions consumer was made (handle).
func consumer(s Subscriber) jetstream.ConsumerConfig {
	events := s.Events
	if len(events) == 0 {
		events = AllEvents
	}
	var filters []string
	for _, e := range events {
		filters = append(filters, subjectPrefix[e]+"*")
	}
	slices.Sort(filters)
	return jetstream.ConsumerConfig{
		Durable:        Durable(s.ID),
		Description:    "Tollgate outgoing webhooks of subscriber " + s.ID,
		FilterSubjects: slices.Compact(filters),
		// A new subscriber starts with the events stored from now on, not
		// with the stream's whole history.
		DeliverPolicy: jetstream.DeliverNewPolicy,
		// One event at a time: stream order per subscriber (package doc).
		MaxAckPending: 1,
		// A consumer left behind by a removed subscriber goes away once
		// the events it could still deliver have expired.
		InactiveThreshold: topology.DefaultConfig().MaxAge,
	}
}

// subjectPrefix is where each event is published; the turn id follows.
var subjectPrefix = map[Event]string{
	EventOutcome:           topology.SubjectTurnOutcome,
	EventApprovalRequested: topology.SubjectApprovalRequested,
	EventApprovalDecided:   topology.SubjectApprovalDecided,
}

// Run creates or updates every subscriber's consumer, the turn-log
// followers' of those that ask for approval.requested or outcome, and the
// decisions followers' of those that ask for approval.decided (creating
// one that does not exist after the approvals bucket's last message), and
// delivers events until ctx is cancelled; then it finishes the deliveries
// under way (a delivery that waits for another consumer stops waiting and
// is left for redelivery) and returns nil. It returns an error when a
// consumer cannot be created (the other subscribers are stopped too).
func (d *Dispatcher) Run(ctx context.Context) error {
	if len(d.runners) == 0 {
		<-ctx.Done()
		return nil
	}
	runners := slices.Clone(d.runners)
	events, err := d.js.Stream(ctx, topology.StreamEvents)
	if err != nil {
		return fmt.Errorf("webhook: stream %s: %w", topology.StreamEvents, err)
	}
	// The events consumers first: one takes the published copy of what is
	// stored before its subscriber's follower is made (its follower then
	// hands that copy over: the package doc), however long that takes.
	for _, s := range d.subs {
		if _, err := topology.EnsureConsumer(ctx, d.js, topology.ConsumerSpec{Stream: topology.StreamEvents, Config: s.consumer}); err != nil {
			return fmt.Errorf("webhook: subscriber %q: consumer %s: %w", s.id, s.consumer.Durable, err)
		}
	}
	var logs []jetstream.Stream
	for _, s := range d.subs {
		s.events, s.stopping = events, ctx.Done()
		if !s.outcomes && !s.requests {
			continue
		}
		if logs == nil {
			if logs, err = topology.OpenTurnLogs(ctx, d.js); err != nil {
				return fmt.Errorf("webhook: %w", err)
			}
		}
		s.logs = logs
		name := Component(s.id)
		cfg := outcomes.Config{
			Component: name, Durable: Durable(s.id), Description: "Tollgate outgoing webhooks of subscriber " + s.id + ": turns' outcomes",
			JS: d.js, Handler: s.outcome, Logger: d.cfg.Logger.With("stage", name), Metrics: d.metrics,
			MaxAttempts: d.cfg.Retry.Attempts, BaseDelay: d.cfg.Retry.Base, MaxDelay: d.cfg.Retry.Max,
		}
		if s.requests {
			cfg.Requests = s.requested
			cfg.Description = "Tollgate outgoing webhooks of subscriber " + s.id + ": turns' requests and outcomes"
		}
		f, err := outcomes.New(ctx, cfg)
		if err != nil {
			return fmt.Errorf("webhook: subscriber %q: %w", s.id, err)
		}
		s.follower = f
		runners = append(runners, f.Runners()...)
	}
	// The decisions followers last: a decision recorded before one is
	// made is taken from its published copy, which the subscriber's events
	// consumer, made first, holds (handle).
	for _, s := range d.subs {
		if !s.decided {
			continue
		}
		name := Component(s.id)
		f, err := decisions.New(ctx, decisions.Config{
			Component: name, Durable: DecidedDurable(s.id), Description: "Tollgate outgoing webhooks of subscriber " + s.id + ": approvals' decisions",
			JS: d.js, Handler: s.decision, From: decisions.FromNow, MaxAckPending: 1, Concurrency: 1,
			Logger: d.cfg.Logger.With("stage", name), Metrics: d.metrics,
			MaxAttempts: d.cfg.Retry.Attempts, BaseDelay: d.cfg.Retry.Base, MaxDelay: d.cfg.Retry.Max,
		})
		if err != nil {
			return fmt.Errorf("webhook: subscriber %q: %w", s.id, err)
		}
		s.decisions = f
		runners = append(runners, f.Runner())
	}
	d.mu.Lock()
	d.running = runners
	d.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(runners))
	for _, r := range runners {
		go func() {
			err := r.Run(ctx)
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var all []error
	for range runners {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	if len(all) > 0 {
		return fmt.Errorf("webhook: %w", errors.Join(all...))
	}
	return nil
}

// subscriber is one subscriber's delivery state.
type subscriber struct {
	id, url                          string
	key                              []byte
	headers                          http.Header
	transports                       map[string]bool
	sessions                         map[string]bool
	client                           *http.Client
	timeout                          time.Duration
	attempts                         int
	approvals                        *approvalBucket
	log                              *slog.Logger
	delivered, failed, undeliverable prometheus.Counter

	// requestWait bounds how long an event waits for the consumer that
	// delivers its turn's request to pass it (requestFirst,
	// publishedRequestFirst), and how long past its revision a decision
	// waits for the move to awaiting that requests it (awaitRequest).
	requestWait time.Duration

	consumer jetstream.ConsumerConfig // its events consumer, as its runner has it
	follows  []string                 // its events consumer's filter subjects
	outcomes bool                     // it asks for outcomes
	requests bool                     // it asks for approval.requested
	decided  bool                     // it asks for approval.decided
	follower *outcomes.Follower       // the turn logs' awaiting and outcome events: set by Run when outcomes or requests
	events   jetstream.Stream         // TOLLGATE_EVENTS, for a turn's last event
	logs     []jetstream.Stream       // the turn logs, by partition: set with follower
	stopping <-chan struct{}          // closed when Run's context ends: waits stop (errStopping)

	// decisions follows the approvals bucket's decided revisions: set by
	// Run when decided.
	decisions *decisions.Follower

	// ahead holds the approval ids of the requests this process sent
	// ahead of their log consumer (requestFirst) or of the events
	// consumer (publishedRequestFirst), until that consumer has passed
	// them: the events waiting for them need not wait, and that consumer
	// does not send them again.
	aheadMu sync.Mutex
	ahead   map[string]bool
}

// maxAhead bounds subscriber.ahead: past it the record is dropped (at
// worst a request is sent again, or an event waits its bound).
const maxAhead = 4096

// markAhead records ids as sent ahead of their log consumer.
func (s *subscriber) markAhead(ids []string) {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	if s.ahead == nil || len(s.ahead)+len(ids) > maxAhead {
		s.ahead = map[string]bool{}
	}
	for _, id := range ids {
		s.ahead[id] = true
	}
}

// isAhead reports whether every one of ids was sent ahead.
func (s *subscriber) isAhead(ids ...string) bool {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	for _, id := range ids {
		if !s.ahead[id] {
			return false
		}
	}
	return len(ids) > 0
}

// passed forgets ids: their log consumer has passed them.
func (s *subscriber) passed(ids []string) {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	for _, id := range ids {
		delete(s.ahead, id)
	}
}

// approvalIDs are the ids of reqs.
func approvalIDs(reqs []*schemas.ApprovalRecord) []string {
	ids := make([]string, len(reqs))
	for i, a := range reqs {
		ids[i] = a.ApprovalID
	}
	return ids
}

func set(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// handle delivers one event of the subscriber's events consumer, if it
// selects it. A published request or outcome goes through the follower,
// which drops it when the turn's log delivers it; a published decision
// through the decisions follower, which drops it when the approvals
// bucket's consumer delivers it, or when it repeats a recorded decision
// (the package doc).
func (s *subscriber) handle(ctx context.Context, m jetstream.Msg) error {
	ev, err := decode(m)
	if err != nil {
		return err
	}
	switch rec := ev.record.(type) {
	case *schemas.TurnOutcome:
		if s.follower != nil {
			return s.follower.Published(ctx, rec, m)
		}
	case *schemas.ApprovalRecord:
		if s.follower != nil && s.requests {
			return s.follower.PublishedRequest(ctx, rec, m)
		}
	case *schemas.DecidedEvent:
		if s.decisions != nil {
			return s.decisions.Published(ctx, rec, m)
		}
	}
	return s.deliver(ctx, ev, m)
}

// decision delivers an approval's decision the decisions follower hands
// over: from its decided revision in the approvals bucket (m, the
// revision: sent as the approval.decided event the approver published,
// stored when the revision was), once its turn's request has been sent
// (awaitRequest, requestFirst, publishedRequestFirst); or a published
// approval.decided event the bucket's consumer does not deliver (m
// itself, sent as it is).
func (s *subscriber) decision(ctx context.Context, e *schemas.DecidedEvent, m jetstream.Msg) error {
	if !strings.HasPrefix(m.Subject(), topology.ApprovalRevisionPrefix) {
		ev, err := decode(m)
		if err != nil {
			return err
		}
		return s.deliver(ctx, ev, m)
	}
	return s.deliver(ctx, decidedEvent(e, storedAt(m)), m)
}

// requested delivers the approvals the follower hands over: those a
// turn's move to awaiting requested, from its log (m, the awaiting event:
// each as its approval.requested event announces it, with the event's
// webhook-id and the awaiting event's stored time; not those this process
// sent ahead, requestFirst), or a published approval.requested event
// whose turn's log does not deliver it (m itself, sent as it is, unless
// this process sent it ahead: publishedRequestFirst). Every
// approval of an awaiting event is tried; the error is then a transient
// one if any attempt may be retried (the whole event is redelivered, its
// delivered approvals sent again: at least once), otherwise the
// permanent ones (the event is dead-lettered).
func (s *subscriber) requested(ctx context.Context, reqs []*schemas.ApprovalRecord, m jetstream.Msg) error {
	if _, _, _, logged := topology.ParseTurnLogSubject(m.Subject()); !logged {
		ids := approvalIDs(reqs)
		if s.isAhead(ids...) {
			s.passed(ids) // a decision sent it ahead of this consumer (publishedRequestFirst)
			return nil
		}
		ev, err := decode(m)
		if err != nil {
			return err
		}
		return s.deliver(ctx, ev, m)
	}
	todo := slices.DeleteFunc(slices.Clone(reqs), func(a *schemas.ApprovalRecord) bool { return s.isAhead(a.ApprovalID) })
	if err := s.deliverRequests(ctx, todo, storedAt(m), m); err != nil {
		return err
	}
	s.passed(approvalIDs(reqs))
	return nil
}

// deliverRequests delivers the requests reqs, kept by a turn's awaiting
// event stored at stored, as m's deliveries (requested).
func (s *subscriber) deliverRequests(ctx context.Context, reqs []*schemas.ApprovalRecord, stored time.Time, m jetstream.Msg) error {
	var transient, permanent []error
	for _, a := range reqs {
		switch err := s.deliver(ctx, requestedEvent(a, stored), m); {
		case err == nil:
		case schemas.Permanent(err):
			permanent = append(permanent, err)
		default:
			transient = append(transient, err)
		}
	}
	if len(transient) > 0 {
		return errors.Join(transient...)
	}
	return errors.Join(permanent...)
}

// outcome delivers a turn's outcome the follower hands over, from the
// turn's log (once the turn's requests, its events on the events
// consumer and its decisions on the decisions consumer have been passed:
// requestFirst, waitForEvents, waitForDecisions) or from its published
// copy. A subscriber that does not ask for outcomes (its
// follower reads its requests) gets none.
func (s *subscriber) outcome(ctx context.Context, o *schemas.TurnOutcome, m jetstream.Msg) error {
	if !s.outcomes {
		return nil
	}
	if _, _, _, logged := topology.ParseTurnLogSubject(m.Subject()); !logged {
		ev, err := decode(m)
		if err != nil {
			return err
		}
		return s.deliver(ctx, ev, m)
	}
	ev := outcomeEvent(o)
	if meta, err := m.Metadata(); err == nil {
		ev.stored = meta.Timestamp
	}
	if ok, err := s.selects(ctx, ev); err != nil || !ok {
		return err
	}
	// The outcome holds its turn in the log consumer: a request of the
	// turn that consumer is to send again (its attempt failed) cannot be
	// sent by it meanwhile, so the wait is only for its ack to show.
	if err := s.requestFirst(ctx, o.TurnID, "", ackSettle, m); err != nil {
		return err
	}
	if err := s.waitForEvents(ctx, o.TurnID); err != nil {
		return err
	}
	if err := s.waitForDecisions(ctx, o); err != nil {
		return err
	}
	return s.send(ctx, ev, m)
}

// Waits between consumers (requestFirst, waitForEvents).
const (
	// eventsPoll is how often waitForEvents looks at the events consumer
	// again.
	eventsPoll = 200 * time.Millisecond
	// requestPoll is how often requestFirst looks at a log consumer again.
	requestPoll = 50 * time.Millisecond
	// requestGrace is what an event of the events consumer waits for its
	// turn's request beyond one attempt's timeout (subscriber.requestWait):
	// time for the log consumer to send the request, then ack it.
	requestGrace = 2 * time.Second
	// ackSettle is what a logged outcome waits for the ack of its turn's
	// request to show on its own consumer.
	ackSettle = time.Second
)

// errStopping is the runner.Waiting error of a delivery that stopped
// waiting for another consumer because the dispatcher stops: the message
// is left for redelivery, not counted as a failure.
type errStopping struct{ what string }

func (e errStopping) Error() string {
	return "the dispatcher stops while " + e.what + ": left for redelivery"
}

// RetryAfter implements runner.Waiting.
func (errStopping) RetryAfter() time.Duration { return time.Second }

// requestFirst makes sure the request of approval id of turn (every
// request of the turn when id is "") reaches the subscriber before the
// event m carries, when the turn's log keeps it and the subscriber's log
// consumer delivers it (outcomes.Follower.DeliversRequest): it returns
// once that consumer has passed the turn's awaiting event (its ack floor
// has reached it: delivered, or given up and dead-lettered), or this
// process has sent the request ahead of it, waiting at most wait; then it
// sends the request itself, under m's attempt count, and an error sending
// it is m's. A request sent ahead is recorded (subscriber.ahead), so that
// this process's log consumer does not send it again; another's may (the
// receiver dedupes by webhook-id). Nothing waits for a request in no log
// (an earlier version's turn, a batch kept in tollgate_batches, one that
// never waited), nor for one the subscriber does not ask for: those come,
// if at all, from the events consumer, in stream order. Other errors are
// transient.
//
// The wait is bounded, not the order: a log consumer may itself hold an
// outcome that waits for the events consumer (waitForEvents), or the
// request that the other event follows.
func (s *subscriber) requestFirst(ctx context.Context, turn, id string, wait time.Duration, m jetstream.Msg) error {
	if !s.requests || s.follower == nil || len(s.logs) == 0 || !schemas.ValidKey(turn) {
		return nil
	}
	p := topology.TurnLogPartition(turn, len(s.logs))
	msg, err := s.logs[p].GetLastMsgForSubject(ctx, topology.TurnLogSubject(p, turn, store.EventAwaiting))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("subscriber %s: the awaiting event of turn %s: %w", s.id, turn, err)
	}
	reqs, err := store.DecodeRequested(turn, msg.Data)
	if err != nil {
		return nil // the log consumer dead-letters it
	}
	if id != "" {
		reqs = slices.DeleteFunc(reqs, func(a *schemas.ApprovalRecord) bool { return a.ApprovalID != id })
	}
	if len(reqs) == 0 {
		return nil
	}
	if logged, err := s.follower.DeliversRequest(ctx, turn, reqs[0].ApprovalID); err != nil || !logged {
		return err
	}
	ids := approvalIDs(reqs)
	durable := outcomes.Durable(Durable(s.id), p)
	deadline := time.Now().Add(wait)
	for {
		if s.isAhead(ids...) {
			return nil
		}
		c, err := s.logs[p].Consumer(ctx, durable)
		if err != nil {
			return fmt.Errorf("subscriber %s: consumer %s: %w", s.id, durable, err)
		}
		if c.CachedInfo().AckFloor.Stream >= msg.Sequence {
			s.passed(ids)
			return nil
		}
		if !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopping:
			return errStopping{"waiting for the requests of turn " + turn}
		case <-time.After(min(requestPoll, time.Until(deadline))):
		}
	}
	s.log.Debug("the log consumer has not sent the turn's request yet: sending it first",
		"subscriber", s.id, "turn", turn, "consumer", durable, "awaiting_seq", msg.Sequence)
	if err := s.deliverRequests(ctx, reqs, msg.Time, m); err != nil {
		return err
	}
	s.markAhead(ids)
	return nil
}

// awaitRequest returns once turn's batch has moved past running, when its
// log keeps it: a decision read from the approvals bucket may have been
// recorded before the move to awaiting that requests it (an approval a
// standing grant decided as the executor created it, or one decided from
// the bucket before its batch waited), and its request must reach the
// subscriber first (requestFirst, which reads that move). It waits while
// the decision is younger than requestWait (stored, when its revision was
// stored): a decision read late (after a downtime) does not wait, nor one
// whose batch never moves on (it failed; the executor stopped). Nothing
// waits for a subscriber that does not ask for requests, nor for a turn
// the logs do not keep. Errors reading the log are transient.
func (s *subscriber) awaitRequest(ctx context.Context, turn string, stored time.Time) error {
	if !s.requests || len(s.logs) == 0 || !schemas.ValidKey(turn) {
		return nil
	}
	p := topology.TurnLogPartition(turn, len(s.logs))
	deadline := stored.Add(s.requestWait)
	for {
		msg, err := s.logs[p].GetLastMsgForSubject(ctx, topology.TurnLogWildcard(p, turn))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil // no log: the request, if any, is published (publishedRequestFirst)
		case err != nil:
			return fmt.Errorf("subscriber %s: the log of turn %s: %w", s.id, turn, err)
		}
		_, _, event, _ := topology.ParseTurnLogSubject(msg.Subject)
		if event != string(schemas.BatchQueued) && event != string(schemas.BatchRunning) {
			return nil
		}
		if !time.Now().Before(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopping:
			return errStopping{"waiting for the move to awaiting of turn " + turn}
		case <-time.After(min(requestPoll, time.Until(deadline))):
		}
	}
}

// publishedRequestFirst is requestFirst for a request published on
// TOLLGATE_EVENTS that no turn log delivers (a batch kept in
// tollgate_batches; a turn an earlier version moved to awaiting), before
// a decision read from the approvals bucket (m): the events consumer
// sends it, in stream order, so the decision waits (at most requestWait)
// until that consumer has passed the turn's last published request (its
// ack floor), or this process has sent it ahead; then, when that request
// is approval id's, it sends it itself first, under m's attempt count,
// and records it sent ahead (the events consumer passes it over then:
// requested). Nothing waits for a subscriber that does not ask for
// requests, nor for a turn with no published request. Other errors are
// transient.
func (s *subscriber) publishedRequestFirst(ctx context.Context, turn, id string, m jetstream.Msg) error {
	if !s.requests || s.events == nil || !schemas.ValidKey(turn) {
		return nil
	}
	msg, err := s.events.GetLastMsgForSubject(ctx, topology.EventSubject(topology.SubjectApprovalRequested, turn))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("subscriber %s: the published requests of turn %s: %w", s.id, turn, err)
	}
	if s.follower != nil {
		if logged, err := s.follower.DeliversRequest(ctx, turn, id); err != nil || logged {
			return err // sent from the log: requestFirst
		}
	}
	deadline := time.Now().Add(s.requestWait)
	for {
		if s.isAhead(id) {
			return nil
		}
		c, err := s.events.Consumer(ctx, Durable(s.id))
		if err != nil {
			return fmt.Errorf("subscriber %s: consumer: %w", s.id, err)
		}
		if c.CachedInfo().AckFloor.Stream >= msg.Sequence {
			return nil
		}
		if !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopping:
			return errStopping{"waiting for the published requests of turn " + turn}
		case <-time.After(min(requestPoll, time.Until(deadline))):
		}
	}
	rec, err := schemas.Decode[schemas.ApprovalRecord](msg.Data)
	if err != nil || rec.ApprovalID != id {
		return nil // not this approval's (or undecodable: the events consumer dead-letters it)
	}
	s.log.Debug("the events consumer has not sent the published request yet: sending it first",
		"subscriber", s.id, "turn", turn, "approval", id, "requested_seq", msg.Sequence)
	ev := requestedEvent(rec, msg.Time)
	if hid := msg.Header.Get(jetstream.MsgIDHeader); hid != "" {
		ev.id = hid
	}
	if err := s.deliver(ctx, ev, m); err != nil {
		return err
	}
	s.markAhead([]string{id})
	return nil
}

// waitForDecisions returns once the subscriber's decisions consumer has
// passed every decision of o's turn's approvals that it delivers (its ack
// floor has reached the last such revision: sent, or given up and
// dead-lettered), so that the turn's outcome is sent after them. The
// turn's approvals are those its results name (ToolResult.ApprovalID, and
// the approval of each call, schemas.ApprovalID); a decision recorded
// after the outcome is read is not waited for. The wait is bounded by
// that consumer's retries of the decision it holds (and requestWait, when
// that decision waits for a request); it also ends with ctx, and when the
// dispatcher stops (errStopping). An error reading the bucket or the
// consumer is transient.
func (s *subscriber) waitForDecisions(ctx context.Context, o *schemas.TurnOutcome) error {
	if s.decisions == nil {
		return nil
	}
	var last uint64
	for _, id := range approvalsOf(o) {
		seq, err := s.decisions.Decision(ctx, id)
		if err != nil {
			return fmt.Errorf("subscriber %s: %w", s.id, err)
		}
		last = max(last, seq)
	}
	if last == 0 {
		return nil
	}
	for {
		ok, err := s.decisions.Passed(ctx, last)
		if err != nil {
			return fmt.Errorf("subscriber %s: %w", s.id, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopping:
			return errStopping{"waiting for the decisions of turn " + o.TurnID}
		case <-time.After(eventsPoll):
		}
	}
}

// approvalsOf are the ids of the approvals o's results name: each
// result's approval, and the approval of each call
// (schemas.ApprovalID(turn, index)), which exists only for a call that
// needed one.
func approvalsOf(o *schemas.TurnOutcome) []string {
	var ids []string
	for _, r := range o.Results {
		if r.ApprovalID != "" {
			ids = append(ids, r.ApprovalID)
		}
		if i, err := strconv.Atoi(strings.TrimPrefix(r.CallID, o.TurnID+"-")); err == nil && i >= 0 && r.CallID == schemas.CallID(o.TurnID, i) {
			ids = append(ids, schemas.ApprovalID(o.TurnID, i))
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// waitForEvents returns once the subscriber's events consumer has passed
// the last event of turn it follows (its ack floor: delivered, or given
// up and dead-lettered), so that the turn's outcome is sent after them.
// The wait is bounded by that consumer's retries of the event it holds
// (and requestWait, when that event waits for a request); it also ends
// with ctx, and when the dispatcher stops (errStopping). An error reading
// the stream or the consumer is transient.
func (s *subscriber) waitForEvents(ctx context.Context, turn string) error {
	var last uint64
	for _, f := range s.follows {
		prefix, ok := strings.CutSuffix(f, "*")
		if !ok || prefix == topology.SubjectTurnOutcome {
			continue // the outcome's published copy is never sent for a logged turn
		}
		m, err := s.events.GetLastMsgForSubject(ctx, prefix+turn)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return fmt.Errorf("subscriber %s: the last events of turn %s: %w", s.id, turn, err)
		default:
			last = max(last, m.Sequence)
		}
	}
	if last == 0 {
		return nil
	}
	for {
		info, err := s.events.Consumer(ctx, Durable(s.id))
		if err != nil {
			return fmt.Errorf("subscriber %s: consumer: %w", s.id, err)
		}
		if info.CachedInfo().AckFloor.Stream >= last {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.stopping:
			return errStopping{"waiting for the events of turn " + turn}
		case <-time.After(eventsPoll):
		}
	}
}

// deliver sends ev (carried by m) to the subscriber, if it selects it; a
// decided event or a published outcome after its turn's requests
// (requestFirst; for a decision from the approvals bucket, a request
// published on TOLLGATE_EVENTS too: publishedRequestFirst), a published
// outcome after its turn's decisions (waitForDecisions). See the package
// doc for what each answer leads to.
func (s *subscriber) deliver(ctx context.Context, ev *event, m jetstream.Msg) error {
	ok, err := s.selects(ctx, ev)
	if err != nil || !ok {
		return err
	}
	switch ev.kind {
	case EventApprovalDecided:
		if ev.bucket {
			err = s.awaitRequest(ctx, ev.turn, ev.stored)
		}
		if err == nil {
			err = s.requestFirst(ctx, ev.turn, ev.approvalID, s.requestWait, m)
		}
		if err == nil && ev.bucket {
			err = s.publishedRequestFirst(ctx, ev.turn, ev.approvalID, m)
		}
	case EventOutcome:
		err = s.requestFirst(ctx, ev.turn, "", s.requestWait, m)
		if o, ok := ev.record.(*schemas.TurnOutcome); ok && err == nil {
			err = s.waitForDecisions(ctx, o)
		}
	}
	if err != nil {
		return err
	}
	return s.send(ctx, ev, m)
}

// send posts ev (carried by m, whose deliveries number the attempts).
func (s *subscriber) send(ctx context.Context, ev *event, m jetstream.Msg) error {
	body, err := ev.body()
	if err != nil {
		return err
	}
	status, err := s.post(ctx, ev.id, body)
	attempt := 1
	if meta, merr := m.Metadata(); merr == nil {
		attempt = int(meta.NumDelivered)
	}
	switch {
	case err == nil && status >= 200 && status < 300:
		s.delivered.Inc()
		return nil
	case err == nil && status == http.StatusGone:
		s.undeliverable.Inc()
		s.log.Warn("webhook receiver answered 410 Gone: event dead-lettered; remove the subscriber from the configuration if it is gone for good",
			"subscriber", s.id, "webhook_id", ev.id)
		return schemas.Errorf(schemas.CodeWebhookUndeliverable, "subscriber %s: event %s: the receiver answered 410 Gone", s.id, ev.id)
	case err == nil:
		err = fmt.Errorf("answered %d %s", status, http.StatusText(status))
	}
	if attempt >= s.attempts {
		s.undeliverable.Inc()
		return schemas.Errorf(schemas.CodeWebhookUndeliverable, "subscriber %s: event %s: no 2xx answer after %d attempts, the last: %w", s.id, ev.id, attempt, err)
	}
	s.failed.Inc()
	return fmt.Errorf("subscriber %s: event %s: attempt %d of %d: %w", s.id, ev.id, attempt, s.attempts, err)
}

// selects reports whether the subscriber receives ev: its session is one
// of the subscriber's, or its transport is. An outcome that goes nowhere
// is sent to nobody.
func (s *subscriber) selects(ctx context.Context, ev *event) (bool, error) {
	if ev.nowhere {
		return false, nil
	}
	if s.sessions[ev.session] {
		return true, nil
	}
	if len(s.transports) == 0 {
		return false, nil
	}
	t := ev.transport
	if ev.kind == EventApprovalDecided {
		// A decided event does not name the transport: its approval does.
		var err error
		if t, err = s.approvals.transport(ctx, ev.approvalID); err != nil {
			return false, err
		}
	}
	return s.transports[t], nil
}

// post sends one signed attempt and returns the answer's status.
func (s *subscriber) post(ctx context.Context, id string, body []byte) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header = s.headers.Clone()
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tollgate-webhooks")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", ts)
	req.Header.Set("webhook-signature", sign(s.key, id, ts, body))
	resp, err := s.client.Do(req)
	if err != nil {
		// Not the URL: it may carry a token in its query.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return 0, fmt.Errorf("POST: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	return resp.StatusCode, nil
}

// sign returns the Standard Webhooks signature header value of a
// delivery: "v1," followed by the standard base64 of HMAC-SHA256, keyed
// with key (the secret's decoded bytes), over "<id>.<timestamp>.<body>".
func sign(key []byte, id, timestamp string, body []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id + "." + timestamp + "."))
	h.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// event is a decoded event message.
type event struct {
	kind       Event
	id         string // webhook-id
	session    string
	turn       string
	transport  string // "" for a decided event: see selects
	approvalID string // decided events
	nowhere    bool   // an outcome with no verified reply target
	bucket     bool   // a decision read from the approvals bucket
	record     any
	stored     time.Time
}

// decode reads an event message. A message that does not decode (or is on
// a subject the dispatcher does not send) is a permanent error: it is
// dead-lettered with its code.
func decode(m jetstream.Msg) (*event, error) {
	ev := &event{id: m.Headers().Get(jetstream.MsgIDHeader), stored: storedAt(m)}
	subject := m.Subject()
	var fallbackID string
	_, rec, err := topology.Read(subject, m.Data(), topology.RouteTurnOutcome, topology.RouteApprovalRequested, topology.RouteApprovalDecided)
	if errors.Is(err, topology.ErrUnrouted) {
		return nil, schemas.Errorf(schemas.CodeUnknownMessage, "subject %s is not a webhook event", subject)
	} else if err != nil {
		return nil, err
	}
	switch rec := rec.(type) {
	case *schemas.TurnOutcome:
		stored, id := ev.stored, ev.id
		ev = outcomeEvent(rec)
		ev.stored, ev.id = stored, id
		fallbackID = topology.OutcomeMsgID(rec.TurnID)
	case *schemas.ApprovalRecord:
		stored, id := ev.stored, ev.id
		ev = requestedEvent(rec, stored)
		ev.id = id
		fallbackID = topology.RequestedMsgID(rec.ApprovalID)
	case *schemas.DecidedEvent:
		e := rec
		ev.kind, ev.record, ev.session, ev.turn, ev.approvalID = EventApprovalDecided, e, e.SessionID, e.TurnID, e.ApprovalID
		fallbackID = topology.DecidedMsgID(e.ApprovalID)
	}
	if ev.id == "" {
		ev.id = fallbackID
	}
	return ev, nil
}

// storedAt is when m was stored (now, when its metadata does not say).
func storedAt(m jetstream.Msg) time.Time {
	if meta, err := m.Metadata(); err == nil {
		return meta.Timestamp
	}
	return time.Now()
}

// outcomeEvent is the event of turn outcome o, whichever message carried
// it: its webhook-id is the published copy's message id,
// topology.OutcomeMsgID, so that a receiver dedupes the two.
func outcomeEvent(o *schemas.TurnOutcome) *event {
	return &event{kind: EventOutcome, id: topology.OutcomeMsgID(o.TurnID), record: o, session: o.SessionID, turn: o.TurnID,
		transport: o.Reply.Transport, nowhere: o.Audience == "", stored: o.FinishedAt}
}

// decidedEvent is the approval.decided event of decision e, read from its
// revision in the approvals bucket stored at stored: its webhook-id is the
// published event's message id, topology.DecidedMsgID, so that a receiver
// dedupes the two.
func decidedEvent(e *schemas.DecidedEvent, stored time.Time) *event {
	return &event{kind: EventApprovalDecided, id: topology.DecidedMsgID(e.ApprovalID), record: e,
		session: e.SessionID, turn: e.TurnID, approvalID: e.ApprovalID, bucket: true, stored: stored}
}

// requestedEvent is the approval.requested event of a, stored at stored,
// whichever message carried it (its published event, or its turn log's
// awaiting event, which keeps it as the published event announces it:
// store.DecodeRequested): its webhook-id is the published event's message
// id, topology.RequestedMsgID, so that a receiver dedupes the two.
func requestedEvent(a *schemas.ApprovalRecord, stored time.Time) *event {
	ev := &event{kind: EventApprovalRequested, id: topology.RequestedMsgID(a.ApprovalID), record: a,
		session: a.SessionID, turn: a.TurnID, stored: stored}
	if a.Context != nil {
		ev.transport = a.Context.Transport
	}
	return ev
}

// body is the JSON body of ev: its type, when it was stored, and the
// record with its wire keys (as `tollgate watch --json` shows it).
func (ev *event) body() ([]byte, error) {
	b, err := msgpack.Marshal(ev.record)
	if err != nil {
		return nil, schemas.Errorf(schemas.CodeMalformed, "re-encode %s: %w", ev.kind, err)
	}
	var data any
	if err := msgpack.Unmarshal(b, &data); err != nil {
		return nil, schemas.Errorf(schemas.CodeMalformed, "re-decode %s: %w", ev.kind, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err = enc.Encode(struct {
		Type      Event     `json:"type"`
		Timestamp time.Time `json:"timestamp"`
		Data      any       `json:"data"`
	}{ev.kind, ev.stored.UTC(), data})
	if err != nil {
		return nil, schemas.Errorf(schemas.CodeMalformed, "JSON of %s: %w", ev.kind, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// approvalBucket finds the transport of an approval in KV
// tollgate_approvals, opened on first use.
type approvalBucket struct {
	js jetstream.JetStream
	mu sync.Mutex
	kv jetstream.KeyValue
}

// transport returns the transport of approval id's turn, or "" when the
// record is missing or does not decode (its events then go to no
// transport's subscribers). Other failures are transient.
func (b *approvalBucket) transport(ctx context.Context, id string) (string, error) {
	b.mu.Lock()
	if b.kv == nil {
		kv, err := b.js.KeyValue(ctx, topology.BucketApprovals)
		if err != nil {
			b.mu.Unlock()
			return "", fmt.Errorf("open %s: %w", topology.BucketApprovals, err)
		}
		b.kv = kv
	}
	kv := b.kv
	b.mu.Unlock()
	e, err := kv.Get(ctx, id)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read approval %s: %w", id, err)
	}
	rec, old, err := schemas.DecodeApproval(e.Value())
	switch {
	case err != nil:
		return "", nil
	case old != nil:
		return old.Transport, nil
	case rec.Context != nil:
		return rec.Context.Transport, nil
	}
	return "", nil
}
