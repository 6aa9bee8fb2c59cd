// Package discord is Tollgate's Discord transport: people ask the agent
// with the /ask slash command in a DM or a guild channel; they answer
// approval prompts with message buttons; they see prompts close and
// results arrive in the channel. It speaks only docs/protocol.md (plus the
// planner's reply event, through DeliverReply), under its own NATS user,
// as transport "discord". It needs no gateway websocket: Discord calls the
// interactions endpoint over HTTP, and Tollgate calls Discord's REST API
// with the bot token.
//
// Requests. Every interaction must carry a valid Ed25519 signature
// (X-Signature-Ed25519 over X-Signature-Timestamp + body, under the
// application's public key) and a timestamp within 5 minutes of the clock:
// otherwise 401. An interaction id seen before is 400 (replayed): the
// record lives in KV bucket tollgate_discord_seen for an hour, longer than
// the signature window and far longer than the streams' 2-minute publish
// dedupe. Every refusal publishes nothing and is counted in
// tollgate_discord_refused_total{reason}. PING is answered PONG. Each
// answer is sent within 3 seconds: the work before it is bounded, and the
// click waits for its own decision only briefly before deferring.
//
// Inbound. /ask <text> becomes an InboundMessage on
// tollgate.inbound.discord.<session key>:
//
//   - message id = the interaction id, Nats-Msg-Id discord:<interaction id>;
//   - session id discord:<thread id> in a thread (a Discord thread is a
//     channel of its own, and a thread is a session), else
//     discord:<channel id>:<interaction id> (each /ask outside a thread
//     starts its own session, as a message starting a thread would);
//   - sender id <user id> (principal discord:<user id>), kind user,
//     verified: the interaction is signed by Discord and names its user;
//     an interaction by a bot user is never a turn;
//   - channel kind: no guild is a DM (dm; a group DM is private); in a
//     guild, a private thread is private, and any other channel is private
//     when its permission overwrites deny VIEW_CHANNEL to @everyone (the
//     role whose id is the guild's) — for a public thread, the parent's
//     overwrites — else public. A channel whose overwrites cannot be read
//     within a second counts as public, the widest audience, so nothing
//     narrower is shown there (and is read again on the next request).
//
// The command is answered with a message echoing the request (type 4).
//
// Prompts. A durable consumer, transport-discord, on TOLLGATE_EVENTS reads
// approval.requested, approval.decided, turn.outcome, turn.reply and
// decision.rejected. A pending approval of a discord turn is posted once
// (record prompt.<approval> in KV bucket tollgate_discord: channel,
// message id, digest) with POST /channels/{id}/messages: a
// personal-audience prompt always into the requester's DM (POST
// /users/@me/channels), never a guild channel; a team or public one into
// the turn's channel. A button's custom_id names its verb, the approval
// and the start of the digest; a click is checked against the prompt
// record (the clicked message must be the approval's prompt) and the
// approval record (the digest, still pending, not expired) before anything
// is published. A click on a decided or expired approval is answered with
// an ephemeral message (flags 64) with the code. The approver decides who
// may decide: its rejection reaches the clicker as an ephemeral follow-up
// on the click's interaction, and the prompt stays open. When the
// clicker's own decision is taken within the answer's budget the click is
// answered UPDATE_MESSAGE (type 7) with the closed prompt; otherwise
// DEFERRED_UPDATE_MESSAGE (type 6), and the approval.decided event closes
// it. Every decided event, from whatever transport, closes a prompt still
// open with PATCH /channels/{id}/messages/{id} and the bot token
// (interaction tokens die after 15 minutes).
//
// Outcomes and replies go to the reply target's channel when the reply
// target is discord and the channel is no wider than the audience; an
// audience "" goes nowhere. Each is posted once (record outcome.<turn>,
// reply.<turn>). Posting runs one request at a time per channel and waits
// out 429s for their Retry-After: a burst is delayed, never dropped.
package discord

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Name is the transport name: the subject token, the decision transport
// and the principal prefix.
const Name = "discord"

// Durable is the transport's consumer on TOLLGATE_EVENTS.
const Durable = "transport-discord"

// DefaultAPIURL is the root of Discord's REST API.
const DefaultAPIURL = "https://discord.com/api/v10"

// Config wires a Transport.
type Config struct {
	// JS is the transport's JetStream connection (its own NATS user).
	JS jetstream.JetStream
	// APIURL is the REST API root (default DefaultAPIURL).
	APIURL string
	// BotToken authenticates REST calls ("Authorization: Bot <token>").
	// Never logged.
	BotToken string
	// PublicKey is the application's Ed25519 public key: it verifies
	// interactions.
	PublicKey ed25519.PublicKey
	// HTTPClient calls the REST API (default: a client with a 30 s timeout).
	HTTPClient *http.Client
	// Replicas of the transport's buckets (default 1).
	Replicas int
	Logger   *slog.Logger
	// Registerer receives the transport's metrics and its runner's; nil
	// registers none.
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time

	// ProposeCalls, when set, gives the tool calls of an /ask request
	// (nil: a text-only message, for the planner). It is how a deployment
	// without the planner, or a test, maps a request to calls.
	ProposeCalls func(text string) []schemas.ProposedCall
}

// Transport is a running Discord transport.
type Transport struct {
	cfg       Config
	log       *slog.Logger
	seen      jetstream.KeyValue // tollgate_discord_seen: interaction ids, clicks
	records   jetstream.KeyValue // tollgate_discord: prompts, posts, clicks
	approvals jetstream.KeyValue
	api       *rest
	runner    *runner.Runner
	kinds     kindCache

	refused   *prometheus.CounterVec
	delivered *prometheus.CounterVec
}

// New binds to the pipeline's streams and bucket (they must exist), creates
// the transport's own buckets if missing (Provision), and builds the
// consumer. Nothing is consumed until Run.
func New(ctx context.Context, cfg Config) (*Transport, error) {
	if cfg.JS == nil || cfg.Logger == nil || cfg.BotToken == "" || len(cfg.PublicKey) != ed25519.PublicKeySize {
		return nil, errors.New("discord: JS, Logger, BotToken and a 32-byte PublicKey are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.APIURL == "" {
		cfg.APIURL = DefaultAPIURL
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	t := &Transport{cfg: cfg, log: cfg.Logger}
	var err error
	if t.seen, t.records, err = Provision(ctx, cfg.JS, cfg.Replicas); err != nil {
		return nil, err
	}
	if t.approvals, err = cfg.JS.KeyValue(ctx, topology.BucketApprovals); err != nil {
		return nil, fmt.Errorf("discord: bucket %s: %w", topology.BucketApprovals, err)
	}
	t.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_discord_refused_total",
		Help: "Discord interactions and events refused or dropped without publishing, by reason.",
	}, []string{"reason"})
	t.delivered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_discord_posts_total",
		Help: "Messages the Discord transport posted or updated, by kind (prompt, close, outcome, reply, rejection).",
	}, []string{"kind"})
	if err := metrics.Register(cfg.Registerer, &t.refused); err != nil {
		return nil, fmt.Errorf("discord: %w", err)
	}
	if err := metrics.Register(cfg.Registerer, &t.delivered); err != nil {
		return nil, fmt.Errorf("discord: %w", err)
	}
	t.api = newREST(cfg.APIURL, cfg.BotToken, cfg.HTTPClient, t.log)
	t.kinds = kindCache{api: t.api, log: t.log, m: map[string]schemas.ChannelKind{}}
	t.runner, err = runner.New(runner.Config{
		Stage: "discord", Stream: topology.StreamEvents, Consumer: consumerConfig(),
		Handler: t.handleEvent, JS: cfg.JS, Logger: t.log.With("stage", "discord"),
		Metrics: runner.NewMetrics(cfg.Registerer), Concurrency: 8,
	})
	if err != nil {
		return nil, fmt.Errorf("discord: %w", err)
	}
	return t, nil
}

// consumerConfig is the durable consumer of the events the transport acts on.
func consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:     Durable,
		Description: "Tollgate Discord transport: prompts, closes, outcomes, replies, rejections",
		FilterSubjects: []string{
			topology.SubjectApprovalDecided + "*",
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

// Run consumes events until ctx is cancelled.
func (t *Transport) Run(ctx context.Context) error { return t.runner.Run(ctx) }

// Ready reports whether the consumer is running (health checks).
func (t *Transport) Ready() error { return t.runner.Ready() }

// Handler serves Discord's interactions endpoint: POST /discord/interactions.
func (t *Transport) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /discord/interactions", t.serveInteraction)
	return mux
}

// refuse counts a refusal and returns its reason.
func (t *Transport) refuse(reason string) string {
	t.refused.WithLabelValues(reason).Inc()
	return reason
}

// Refusal reasons, the reason label of tollgate_discord_refused_total.
const (
	ReasonBadSignature   = "bad_signature"   // missing or wrong Ed25519 signature: 401
	ReasonStaleTimestamp = "stale_timestamp" // timestamp outside 5 minutes: 401
	ReasonReplayed       = "replayed"        // an interaction id seen before: 400
	ReasonMalformed      = "malformed"       // not an interaction Tollgate reads: 400
	ReasonUnknownAction  = "unknown_action"  // a command or custom_id Tollgate never sent: 400
	ReasonActionMismatch = "action_mismatch" // the button does not belong to the approval it names, or the digest differs: 400
	ReasonNotPending     = "not_pending"     // a click on a decided or expired approval: ephemeral answer, nothing published
	ReasonBotMessage     = "bot_message"     // an interaction by a bot user: not a turn
	ReasonNowhere        = "nowhere"         // an outcome or reply with no deliverable target
)
