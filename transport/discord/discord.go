// Package discord is Tollgate's Discord transport: people ask the agent
// with the /ask slash command in a DM or a guild channel; they answer
// approval prompts with message buttons; they see prompts close and
// results arrive in the channel. It speaks only docs/protocol.md (plus the
// planner's reply event), under its own NATS user,
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
// Prompts. The chat framework (transport/chat) runs the transport's
// consumers; this package is its Discord client and renderer. Requests
// and outcomes come from the turn logs (durables
// transport-discord-outcome-<i>), approvals' decisions from the approvals
// bucket's stream (durable transport-discord-decided on
// KV_tollgate_approvals), and the planner's replies, the approver's
// rejections and an earlier version's published requests and outcomes
// from TOLLGATE_EVENTS (durable transport-discord). A pending approval of
// a discord turn is posted once
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
// DEFERRED_UPDATE_MESSAGE (type 6), and the approval's decision (its
// decided revision in KV tollgate_approvals) closes it. Every decision,
// from whatever transport, closes a prompt still open with PATCH
// /channels/{id}/messages/{id} and the bot token (interaction tokens die
// after 15 minutes); a decision made while the prompt is posted closes it
// as soon as its record is written.
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
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Name is the transport name: the subject token, the decision transport
// and the principal prefix.
const Name = "discord"

// Durable is the transport's consumer on TOLLGATE_EVENTS, and the prefix
// of its others (outcomes.Durable, decisions.Durable).
const Durable = "transport-" + Name

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

// Transport is a running Discord transport: the chat framework
// (chat.Transport) with Discord's client and renderer (platform).
type Transport struct {
	cfg   Config
	log   *slog.Logger
	core  *chat.Transport[*outgoing]
	api   *rest
	kinds kindCache
}

// New binds to the pipeline's streams and bucket (they must exist), creates
// the transport's own buckets if missing (Provision), and builds the
// consumers (chat.New). Nothing is consumed until Run.
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
	t.api = newREST(cfg.APIURL, cfg.BotToken, cfg.HTTPClient, t.log)
	t.kinds = kindCache{api: t.api, log: t.log, m: map[string]schemas.ChannelKind{}}
	var err error
	t.core, err = chat.New(ctx, chat.Config{
		Name: Name, Title: "Discord", JS: cfg.JS, Replicas: cfg.Replicas, Logger: cfg.Logger, Registerer: cfg.Registerer, Now: cfg.Now,
	}, (*platform)(t))
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Run consumes events until ctx is cancelled.
func (t *Transport) Run(ctx context.Context) error { return t.core.Run(ctx) }

// Ready reports whether the consumers are running (health checks).
func (t *Transport) Ready() error { return t.core.Ready() }

// Handler serves Discord's interactions endpoint: POST /discord/interactions.
func (t *Transport) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /discord/interactions", t.serveInteraction)
	return mux
}

// DeliverOutcome posts a turn's results into its reply target's channel,
// once per turn (chat.Transport.DeliverOutcome): only for a discord reply
// target whose channel is no wider than the outcome's audience.
func (t *Transport) DeliverOutcome(ctx context.Context, o *schemas.TurnOutcome) error {
	return t.core.DeliverOutcome(ctx, o)
}

// DeliverReply posts the planner's reply to a turn into the reply
// target's channel, once per turn (chat.Transport.DeliverReply).
func (t *Transport) DeliverReply(ctx context.Context, r *schemas.ReplyEvent) error {
	return t.core.DeliverReply(ctx, r)
}

// refuse counts a refusal and returns its reason.
func (t *Transport) refuse(reason string) string { return t.core.Refuse(reason) }

// Refusal reasons, the reason label of tollgate_discord_refused_total
// (chat's reasons; see there).
const (
	ReasonBadSignature   = chat.ReasonBadSignature   // missing or wrong Ed25519 signature: 401
	ReasonStaleTimestamp = chat.ReasonStaleTimestamp // timestamp outside 5 minutes: 401
	ReasonReplayed       = chat.ReasonReplayed       // an interaction id seen before: 400
	ReasonMalformed      = chat.ReasonMalformed      // not an interaction Tollgate reads: 400
	ReasonUnknownAction  = chat.ReasonUnknownAction  // a command or custom_id Tollgate never sent: 400
	ReasonActionMismatch = chat.ReasonActionMismatch // the button does not belong to the approval it names, or the digest differs: 400
	ReasonNotPending     = chat.ReasonNotPending     // a click on a decided or expired approval: ephemeral answer, nothing published
	ReasonBotMessage     = chat.ReasonBotMessage     // an interaction by a bot user: not a turn
	ReasonNowhere        = chat.ReasonNowhere        // an outcome or reply with no deliverable target
)
