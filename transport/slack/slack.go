// Package slack is Tollgate's Slack transport: people ask the agent in a
// DM, a channel mention or a thread reply; they answer approval prompts
// with Block Kit buttons; they see prompts close and results arrive in the
// thread. It speaks only docs/protocol.md (plus the planner's reply event), under its own NATS user, as transport "slack".
//
// Inbound. A Slack event (Events API over HTTP, or the same payload over a
// Socket Mode websocket) becomes an InboundMessage on
// tollgate.inbound.slack.<session key> when it is a plain user message in
// an im, an app_mention, or a reply in a thread Tollgate already serves:
//
//   - message id <team>:<channel>:<ts>, Nats-Msg-Id slack:<message id>, so
//     a repeat at any time is the same turn;
//   - session id slack:<team>:<channel>:<thread ts> (the thread, or the
//     message that starts one), so a thread is a session;
//   - sender id <team>:<user> (principal slack:<team>:<user>, unique across
//     workspaces; the user's own team in a Slack Connect channel), kind
//     user, verified: the event came from Slack itself
//     (signed request or the app's Socket Mode connection) and names a
//     human user;
//   - channel kind from the conversation type: im is dm, mpim and private
//     channels are private, public channels public; thread = the thread ts.
//
// Messages of bots (bot_id, a bot_message subtype, Tollgate's own user)
// and every other subtype (edits, deletions, joins) never become turns.
//
// Requests. In HTTP mode every request must carry a valid v0 signature
// (X-Slack-Signature, HMAC-SHA256 of "v0:<timestamp>:<body>" with the
// signing secret) and a timestamp within 5 minutes of the clock: otherwise
// 401. A request seen before (same signature) is 400, and an event id or
// action seen before (Slack's own retry) is answered 200 without work.
// Both records live in KV bucket tollgate_slack_seen for an hour (its
// max age), longer than Slack's 5-minute replay window and far longer
// than the streams' 2-minute publish dedupe. Every refusal publishes
// nothing and is counted in tollgate_slack_refused_total{reason}. The
// answer is sent as soon as the request is checked and its work recorded;
// calls to Slack's API (views, ephemeral messages) run afterwards.
//
// Prompts. The chat framework (transport/chat) runs the transport's
// consumers; this package is its Slack client and renderer. Requests and
// outcomes come from the turn logs (durables transport-slack-outcome-<i>),
// approvals' decisions from the approvals bucket's stream (durable
// transport-slack-decided on KV_tollgate_approvals), and the planner's
// replies, the approver's rejections and an earlier version's published
// requests and outcomes from TOLLGATE_EVENTS (durable transport-slack).
// A pending approval of a slack turn is posted once
// (record prompt.<approval> in KV bucket tollgate_slack: channel, ts,
// digest): a personal-audience prompt always into the requester's DM
// (conversations.open), never a shared channel; a team or public one into
// the turn's channel and thread. Approve publishes a Decision; Deny opens a
// modal for a reason, sent as the decision's note. A click is checked against the prompt record (the
// clicked message must be the approval's prompt, the digest in the button
// the approval's) and the approval record (still pending, not expired)
// before anything is published. The approver decides who may decide: its
// rejection reaches the clicker as an ephemeral message with the code, and
// the prompt stays open. Every decision, from whatever transport (its
// decided revision in KV tollgate_approvals), closes the prompt in place
// (chat.update: no buttons, who and when, and the decider's note as inert
// text); a decision made while the prompt is posted closes it as soon as
// its record is written.
//
// Outcomes and the planner's replies go to the reply target's channel and
// thread when the reply target is slack and the channel is no wider than the outcome's audience;
// an outcome with audience "" goes nowhere. Each is posted once (record
// outcome.<turn>, reply.<turn>); a reply is posted with & < > escaped. Posting runs one message at a time per channel and waits
// out 429s for their Retry-After: a burst is delayed, never dropped.
package slack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Name is the transport name: the subject token, the decision
// transport and the principal prefix.
const Name = "slack"

// Durable is the transport's consumer on TOLLGATE_EVENTS, and the prefix
// of its others (outcomes.Durable, decisions.Durable).
const Durable = "transport-" + Name

// Config wires a Transport.
type Config struct {
	// JS is the transport's JetStream connection (its own NATS user).
	JS jetstream.JetStream
	// API is the Slack Web API client (bot token).
	API *slack.Client
	// SigningSecret verifies HTTP requests (HTTP mode; unused by Socket
	// Mode). Never logged.
	SigningSecret string
	// BotUserID is the app's own user, whose messages are never turns;
	// empty: asked with auth.test at New.
	BotUserID string
	// Replicas of the transport's buckets (default 1).
	Replicas int
	Logger   *slog.Logger
	// Registerer receives the transport's metrics and its runner's; nil
	// registers none.
	Registerer prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time

	// ProposeCalls, when set, gives the tool calls of an inbound message
	// (nil: a text-only message, for the planner). It is how a deployment
	// without the planner, or a test, maps a message to calls.
	ProposeCalls func(text string) []schemas.ProposedCall
}

// Transport is a running Slack transport: the chat framework
// (chat.Transport) with Slack's client and renderer (platform).
type Transport struct {
	cfg    Config
	log    *slog.Logger
	core   *chat.Transport[message]
	poster *poster
	kinds  kindCache
	// bg is the context of what a request's answer does not wait for
	// (answer.after); it ends with Run's context.
	bg   context.Context
	stop context.CancelFunc
}

// New binds to the pipeline's streams and bucket (they must exist), creates
// the transport's own buckets if missing (Provision), and builds the
// consumers (chat.New). Nothing is consumed until Run.
func New(ctx context.Context, cfg Config) (*Transport, error) {
	if cfg.JS == nil || cfg.API == nil || cfg.Logger == nil {
		return nil, errors.New("slack: JS, API and Logger are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.BotUserID == "" {
		who, err := cfg.API.AuthTestContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("slack: auth.test: %w", err)
		}
		cfg.BotUserID = who.UserID
	}
	t := &Transport{cfg: cfg, log: cfg.Logger}
	t.poster = newPoster(t.log)
	t.kinds = kindCache{api: cfg.API, m: map[string]schemas.ChannelKind{}}
	var err error
	t.core, err = chat.New(ctx, chat.Config{
		Name: Name, Title: "Slack", JS: cfg.JS, Replicas: cfg.Replicas, Logger: cfg.Logger, Registerer: cfg.Registerer, Now: cfg.Now,
	}, (*platform)(t))
	if err != nil {
		return nil, err
	}
	t.bg, t.stop = context.WithCancel(context.Background())
	return t, nil
}

// Run consumes events until ctx is cancelled; then the work requests
// started after their answers is cancelled too.
func (t *Transport) Run(ctx context.Context) error {
	defer t.stop()
	return t.core.Run(ctx)
}

// Ready reports whether the consumers are running (health checks).
func (t *Transport) Ready() error { return t.core.Ready() }

// Handler serves Slack's HTTP requests (HTTP mode): POST /slack/events
// (Events API) and POST /slack/interactivity (interactivity).
func (t *Transport) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /slack/events", t.serveEvents)
	mux.HandleFunc("POST /slack/interactivity", t.serveInteractivity)
	return mux
}

// later runs f after a request was answered.
func (t *Transport) later(f func(context.Context)) { go f(t.bg) }

// refuse counts a refusal and returns its reason.
func (t *Transport) refuse(reason string) string { return t.core.Refuse(reason) }

// Refusal reasons, the reason label of tollgate_slack_refused_total
// (chat's reasons; see there).
const (
	ReasonBadSignature   = chat.ReasonBadSignature   // missing or wrong v0 signature: 401
	ReasonStaleTimestamp = chat.ReasonStaleTimestamp // timestamp outside 5 minutes: 401
	ReasonReplayed       = chat.ReasonReplayed       // the same signed request again: 400
	ReasonDuplicate      = chat.ReasonDuplicate      // an event id or action seen before (Slack's retry): 200, no work
	ReasonMalformed      = chat.ReasonMalformed      // not a payload Tollgate reads: 400
	ReasonUnknownAction  = chat.ReasonUnknownAction  // an action id or view Tollgate never sent: 400
	ReasonActionMismatch = chat.ReasonActionMismatch // the button does not belong to the approval it names, or the digest differs: 400
	ReasonNotPending     = chat.ReasonNotPending     // a click on a decided or expired approval: 200 + ephemeral, nothing published
	ReasonBotMessage     = chat.ReasonBotMessage     // a message by a bot (Tollgate's own too): not a turn
	ReasonIgnored        = chat.ReasonIgnored        // an event that is not a turn (edits, other subtypes, unknown threads)
	ReasonNowhere        = chat.ReasonNowhere        // an outcome or reply with no deliverable target
)

// teamUser splits a sender id "<team>:<user>".
func teamUser(senderID string) (team, user string) {
	team, user, _ = strings.Cut(senderID, ":")
	return team, user
}

// DeliverOutcome posts a turn's results into its reply target's thread,
// once per turn (chat.Transport.DeliverOutcome): only for a slack reply
// target whose channel is no wider than the outcome's audience.
func (t *Transport) DeliverOutcome(ctx context.Context, o *schemas.TurnOutcome) error {
	return t.core.DeliverOutcome(ctx, o)
}

// DeliverReply posts the planner's reply to a turn into the reply
// target's thread, once per turn (chat.Transport.DeliverReply), with
// & < > escaped: no mention, no link markup.
func (t *Transport) DeliverReply(ctx context.Context, r *schemas.ReplyEvent) error {
	return t.core.DeliverReply(ctx, r)
}
