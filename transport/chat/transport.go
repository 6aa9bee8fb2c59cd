package chat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/decisions"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Place is where a message goes: a channel, a thread in it ("" for none;
// a platform without threads ignores it) and the channel's kind.
type Place struct {
	Channel, Thread string
	Kind            schemas.ChannelKind
}

// Platform is what a chat platform implements for a Transport: its client
// (post, edit, ephemeral), its renderer (prompt, closed prompt, outcome,
// reply) and where a prompt goes. M is the platform's message. Inbound
// requests (and the kind of the channel they come from) are the
// platform's own; it checks their signature with ReadSigned and clicks
// with Check, Undecidable and NewDecision.
type Platform[M any] interface {
	// PromptTarget is where the prompt of an approval of a turn with
	// context c goes: a personal-audience prompt into the requester's DM
	// (kind dm), never a shared channel; any other into the turn's
	// channel (and thread).
	PromptTarget(ctx context.Context, c *schemas.TurnContext) (Place, error)
	// Post posts m at place and returns the posted message's id.
	Post(ctx context.Context, at Place, m M) (string, error)
	// Edit replaces the message id in channel with m.
	Edit(ctx context.Context, channel, id string, m M) error
	// Ephemeral shows text to the decider of the rejected decision r
	// alone, and returns the channel it was shown in; "" when it can no
	// longer be shown (nothing is recorded then).
	Ephemeral(ctx context.Context, r *schemas.DecisionRejected, text string) (string, error)

	// RenderPrompt is a pending approval's prompt: tool, arguments,
	// digest, requester, expiry and the buttons of its options.
	RenderPrompt(rec *schemas.ApprovalRecord) M
	// RenderClosed is a prompt that can no longer be answered: no
	// buttons, its status, who decided (d; nil: tollgate), when, and the
	// decider's note as inert text.
	RenderClosed(p *Record, status schemas.ApprovalStatus, d *schemas.DecisionInfo, at time.Time) M
	// RenderOutcome is a turn's results.
	RenderOutcome(o *schemas.TurnOutcome) M
	// RenderReply is the planner's reply text, made inert (no mention, no
	// disguised link).
	RenderReply(text string) M

	// Permanent wraps a failed call of what: a refusal by the platform
	// becomes schemas.CodeChatUndeliverable (dead-lettered, not retried),
	// anything else stays transient.
	Permanent(what string, err error) error
}

// Config wires a Transport.
type Config struct {
	// Name is the transport name: the subject token, the decision
	// transport, the principal prefix, and part of the names of the
	// buckets, the consumer and the metrics ("slack").
	Name string
	// Title names the platform to people ("Slack").
	Title string
	// JS is the transport's JetStream connection (its own NATS user).
	JS jetstream.JetStream
	// Replicas of the transport's buckets (default 1).
	Replicas int
	Logger   *slog.Logger
	// Registerer receives the transport's metrics and its runner's; nil
	// registers none.
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Validate reports a Config that cannot run.
func (c *Config) Validate() error {
	switch {
	case c.Name == "" || strings.ContainsAny(c.Name, ".*> "):
		return fmt.Errorf("chat: Name %q is not a transport name", c.Name)
	case c.JS == nil, c.Logger == nil:
		return fmt.Errorf("%s: JS and Logger are required", c.Name)
	}
	return nil
}

// Transport is the part of a chat transport every platform shares, as a
// router is to its handlers: the buckets of what it posted and saw, the
// counters, the durable consumers (TOLLGATE_EVENTS, the turn logs, the
// approvals bucket's stream) and the five handlers (prompt, close,
// outcome, reply, rejection), the "still decidable" rule and the
// decisions a click publishes. A platform
// (Platform) supplies the client and the renderer. Safe for concurrent
// use.
type Transport[M any] struct {
	cfg       Config
	p         Platform[M]
	log       *slog.Logger
	seen      jetstream.KeyValue // tollgate_<name>_seen: replay and retry records, clicks
	records   jetstream.KeyValue // tollgate_<name>: prompts, posts, threads
	approvals jetstream.KeyValue
	runner    *runner.Runner
	outcomes  *outcomes.Follower  // the turn logs' outcome and awaiting events
	decisions *decisions.Follower // the approvals bucket's decided revisions
	refused   *prometheus.CounterVec
	posts     *prometheus.CounterVec
}

// Post kinds, the kind label of tollgate_<name>_posts_total. Each counts
// one meaning on every platform.
const (
	KindPrompt    = "prompt"    // a prompt posted
	KindClose     = "close"     // a prompt closed in place (edited)
	KindOutcome   = "outcome"   // a turn's results posted
	KindReply     = "reply"     // the planner's reply posted
	KindRejection = "rejection" // an approver's rejection shown to the decider; not the notice of a click on an undecidable approval (that is refused_total{reason="not_pending"})
)

// New binds to the pipeline's approvals bucket (it must exist), creates
// the transport's own buckets if missing (Provision), registers the
// counters and builds the consumers (creating those of the turn logs and
// of the approvals bucket's stream that do not exist). Nothing is
// consumed until Run.
func New[M any](ctx context.Context, cfg Config, p Platform[M]) (*Transport[M], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("%s: no platform", cfg.Name)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Title == "" {
		cfg.Title = cfg.Name
	}
	t := &Transport[M]{cfg: cfg, p: p, log: cfg.Logger}
	var err error
	if t.seen, t.records, err = Provision(ctx, cfg.JS, cfg.Name, cfg.Title, cfg.Replicas); err != nil {
		return nil, err
	}
	if t.approvals, err = cfg.JS.KeyValue(ctx, topology.BucketApprovals); err != nil {
		return nil, fmt.Errorf("%s: bucket %s: %w", cfg.Name, topology.BucketApprovals, err)
	}
	t.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_" + cfg.Name + "_refused_total",
		Help: cfg.Title + " requests and events refused or dropped without publishing, by reason.",
	}, []string{"reason"})
	t.posts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_" + cfg.Name + "_posts_total",
		Help: "Messages the " + cfg.Title + " transport posted or updated, by kind (prompt, close, outcome, reply, rejection).",
	}, []string{"kind"})
	for _, c := range []**prometheus.CounterVec{&t.refused, &t.posts} {
		if err := metrics.Register(cfg.Registerer, c); err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.Name, err)
		}
	}
	rm := runner.NewMetrics(cfg.Registerer)
	t.runner, err = runner.New(runner.Config{
		Component: cfg.Name, Stream: topology.StreamEvents, Consumer: ConsumerConfig(cfg.Name, cfg.Title),
		Handler: t.handleEvent, JS: cfg.JS, Logger: t.log.With("stage", cfg.Name),
		Metrics: rm, Concurrency: 8,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	t.outcomes, err = outcomes.New(ctx, outcomes.Config{
		Component: cfg.Name, Durable: Durable(cfg.Name), Description: "Tollgate " + cfg.Title + " transport: turns' outcomes",
		JS: cfg.JS, Handler: func(ctx context.Context, o *schemas.TurnOutcome, _ jetstream.Msg) error {
			return t.DeliverOutcome(ctx, o)
		},
		Requests: func(ctx context.Context, reqs []*schemas.ApprovalRecord, _ jetstream.Msg) error {
			for _, a := range reqs {
				if err := t.prompt(ctx, a); err != nil {
					return err
				}
			}
			return nil
		},
		Logger: t.log.With("stage", cfg.Name), Metrics: rm, Concurrency: 8,
	})
	if err != nil {
		return nil, err
	}
	t.decisions, err = decisions.New(ctx, decisions.Config{
		Component: cfg.Name, Durable: decisions.Durable(Durable(cfg.Name)),
		Description: "Tollgate " + cfg.Title + " transport: approvals' decisions (prompts to close)",
		JS:          cfg.JS, From: decisions.FromAll,
		Handler: func(ctx context.Context, ev *schemas.DecidedEvent, _ jetstream.Msg) error {
			return t.closePrompt(ctx, ev)
		},
		Logger: t.log.With("stage", cfg.Name), Metrics: rm, Concurrency: 8,
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Durable is the name of transport name's consumer on TOLLGATE_EVENTS.
func Durable(name string) string { return "transport-" + name }

// ConsumerConfig is the durable consumer of the events on TOLLGATE_EVENTS
// a chat transport acts on: approval.requested, decision.rejected,
// turn.outcome and turn.reply. A turn's requests and outcome come from
// its turn log's awaiting and outcome events (consumers
// "<Durable>-outcome-<i>", outcomes.Follower); a published
// approval.requested or turn.outcome is delivered only when the turn's
// log does not deliver it (a turn an earlier version moved on, a batch
// kept in tollgate_batches). Decisions come from the approvals bucket's
// stream (consumer decisions.Durable(Durable(name)), decisions.Follower),
// not from approval.decided, which the consumer no longer follows.
func ConsumerConfig(name, title string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:     Durable(name),
		Description: "Tollgate " + title + " transport: prompts, outcomes, replies, rejections",
		FilterSubjects: []string{
			topology.SubjectApprovalRequested + "*",
			topology.SubjectDecisionRejected + "*",
			topology.SubjectTurnOutcome + "*",
			topology.SubjectTurnReply + "*",
		},
		// A new consumer starts with the events stored from now on; once
		// created it keeps its place across restarts (catch-up).
		DeliverPolicy: jetstream.DeliverNewPolicy,
	}
}

// Run consumes events, the turn logs' outcome and awaiting events and the
// approvals' decisions until ctx is cancelled; one consumer failing stops
// the others (runner.RunAll).
func (t *Transport[M]) Run(ctx context.Context) error {
	return runner.RunAll(ctx, append([]*runner.Runner{t.runner, t.decisions.Runner()}, t.outcomes.Runners()...)...)
}

// Ready reports whether the consumers are running (health checks).
func (t *Transport[M]) Ready() error {
	return errors.Join(t.runner.Ready(), t.outcomes.Ready(), t.decisions.Ready())
}

// Name is the transport name.
func (t *Transport[M]) Name() string { return t.cfg.Name }

// Now is the transport's clock.
func (t *Transport[M]) Now() time.Time { return t.cfg.Now() }

// Refuse counts a refusal in tollgate_<name>_refused_total and returns
// its reason.
func (t *Transport[M]) Refuse(reason string) string {
	t.refused.WithLabelValues(reason).Inc()
	return reason
}

// Posted counts a message of kind (KindPrompt, …) in
// tollgate_<name>_posts_total.
func (t *Transport[M]) Posted(kind string) { t.posts.WithLabelValues(kind).Inc() }

// Approval reads approval id from the approvals bucket; nil without error
// when it is absent or unreadable (Approval).
func (t *Transport[M]) Approval(ctx context.Context, id string) (*schemas.ApprovalRecord, error) {
	return Approval(ctx, t.approvals, id)
}

// MarkSeen creates key in the seen bucket; false when it was seen before.
func (t *Transport[M]) MarkSeen(ctx context.Context, key string) (bool, error) {
	return MarkSeen(ctx, t.seen, key)
}

// Unmark removes a seen record after the work it guarded failed before
// it was answered, so that the platform's retry is handled.
func (t *Transport[M]) Unmark(key string) { Unmark(t.seen, key) }

// handleEvent is the consumer's handler. Every handler is idempotent: a
// redelivered or replayed event finds its record and posts nothing.
func (t *Transport[M]) handleEvent(ctx context.Context, m jetstream.Msg) error {
	return HandleEvent(ctx, t.cfg.Name, Handlers{
		// A published request or outcome is delivered only when the turn
		// logs' consumers do not deliver it (outcomes.Follower's
		// PublishedRequest and Published).
		Prompt: func(ctx context.Context, a *schemas.ApprovalRecord) error {
			return t.outcomes.PublishedRequest(ctx, a, m)
		},
		Outcome: func(ctx context.Context, o *schemas.TurnOutcome) error { return t.outcomes.Published(ctx, o, m) }, Reply: t.DeliverReply, Rejected: t.rejected,
	}, m)
}
