// Package ingest is the stage that accepts chat-transport messages as turns.
//
// For each inbound message it validates the payload, canonicalises the
// proposed calls' arguments, and builds the turn's TurnContext exactly once,
// from the message and the transport's policy rule: the requester's
// principal, channel and thread, audience (dm -> personal, private -> team,
// public -> public: there is no default), trust boundary, whether the
// requester can answer approval prompts, and provenance. The accepted turn
// is published with the turn id as message id; the turn id is derived from
// (transport, message id), so a redelivered or re-sent message is the same
// turn. The TurnContext's times come from the stored message (its stream
// timestamp, not the wall clock); only provenance.ingested_by can differ
// between two ingests of one message, and the executor keeps the first
// batch it records for a turn.
//
// The transport and session named in the message must be the ones in its
// subject (tollgate.inbound.<transport>.<session key>), so that a transport
// permitted to publish only on its own subjects cannot borrow another
// transport's trust rule or principals, and so that the executor finds a
// session's messages where it looks for them (arrival order).
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Stage is the ingest stage name.
const Stage = "ingest"

// Config wires an Ingest.
type Config struct {
	JS          jetstream.JetStream
	Policy      *policy.Policy
	Keys        *seal.KeyRing // seals every TurnContext ingest builds
	Logger      *slog.Logger
	Metrics     *runner.Metrics
	Instance    string // recorded in provenance, e.g. "ingest@host"
	Concurrency int    // default 4
	// Plan routes turns with text and no calls to the planner
	// (topology.PlanSubject) instead of the executor; a turn with calls
	// always goes to the executor. With Plan, ingest also takes the
	// planner's step batches to the accepted subject (HandleStep, on
	// topology.IngestStepsConsumer). Set where a planner runs.
	Plan bool
	// TracerProvider traces each message the stage handles
	// (runner.Config.TracerProvider); nil is otel's global provider.
	TracerProvider trace.TracerProvider
}

// Validate reports missing wiring.
func (c Config) Validate() error {
	if c.JS == nil || c.Policy == nil || c.Keys == nil || c.Logger == nil || c.Metrics == nil || c.Instance == "" {
		return errors.New("ingest: JS, Policy, Keys, Logger, Metrics and Instance are required")
	}
	return nil
}

// Ingest is the ingest stage.
type Ingest struct{ cfg Config }

// New returns an Ingest.
func New(cfg Config) (*Ingest, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	return &Ingest{cfg: cfg}, nil
}

// Run consumes inbound messages, and with Config.Plan the planner's step
// batches (HandleStep), until ctx is cancelled.
func (in *Ingest) Run(ctx context.Context) error {
	specs, handlers := []topology.ConsumerSpec{topology.IngestConsumer()}, []runner.Handler{in.Handle}
	if in.cfg.Plan {
		specs, handlers = append(specs, topology.IngestStepsConsumer()), append(handlers, in.HandleStep)
	}
	rs := make([]*runner.Runner, len(specs))
	for i, spec := range specs {
		r, err := runner.New(runner.Config{
			Stage:          Stage,
			Stream:         spec.Stream,
			Consumer:       spec.Config,
			Handler:        handlers[i],
			JS:             in.cfg.JS,
			Logger:         in.cfg.Logger,
			Metrics:        in.cfg.Metrics,
			Concurrency:    in.cfg.Concurrency,
			TracerProvider: in.cfg.TracerProvider,
		})
		if err != nil {
			return err
		}
		rs[i] = r
	}
	return runner.RunAll(ctx, rs...)
}

// Handle accepts one inbound message: it applies Admit, seals the turn's
// TurnContext and publishes the accepted turn (to the planner when
// Config.Plan is set and the turn has text and no calls). Admit's coded errors are
// permanent (the runner dead-letters the message); sealing and publishing
// errors are retried.
func (in *Ingest) Handle(ctx context.Context, m jetstream.Msg) error {
	var prov schemas.Provenance
	if meta, err := m.Metadata(); err == nil {
		prov.StreamSeq, prov.ReceivedAt = meta.Sequence.Stream, meta.Timestamp.UTC()
	}
	prov.IngestedBy = in.cfg.Instance
	t, err := Admit(m.Subject(), m.Data(), in.cfg.Policy, prov)
	if err != nil {
		return err
	}
	if err := in.cfg.Keys.Seal(t.Context); err != nil {
		return err
	}
	key := schemas.SessionKeyOf(t.Context)
	subj, msgID := topology.AcceptedSubject(key), topology.AcceptedMsgID(t.TurnID)
	if in.cfg.Plan && len(t.Calls) == 0 && t.Text != "" {
		subj, msgID = topology.PlanSubject(key), topology.PlanMsgID(t.TurnID)
	}
	if err := bus.Publish(ctx, in.cfg.JS, subj, msgID, t); err != nil {
		return err
	}
	in.cfg.Logger.Debug("turn accepted", "turn", t.TurnID, "session", t.Context.SessionID,
		"principal", t.Context.Requester.Principal, "audience", t.Context.Audience, "calls", len(t.Calls))
	return nil
}

// Admit is ingest's admission rule: whether the inbound message data,
// stored on subject, becomes a turn under policy p, and which turn. It is
// pure and deterministic (no I/O and no clock: the turn's times come from
// prov and the message), so that the stage, the executor's session-order
// check and `tollgate send` (before it publishes) all decide alike.
//
// The message must decode as a current InboundMessage within the input
// limits (schemas.Decode), must have been published on its own subject,
// tollgate.inbound.<transport>.<session key> (so a transport permitted to
// publish only on its own subjects cannot borrow another transport's trust
// rule or principals, and the executor finds a session's messages where it
// looks for them), and must pass Accept. On success it returns the turn
// Accept builds, its TurnContext not yet sealed. Every error is a
// *schemas.Error: MALFORMED_PAYLOAD, PAYLOAD_TOO_LARGE,
// SCHEMA_VERSION_UNSUPPORTED, INVALID_INPUT, ARGS_INVALID_JSON or
// TURN_CONTEXT_INVALID; a message refused here can never become a turn.
func Admit(subject string, data []byte, p *policy.Policy, prov schemas.Provenance) (*schemas.AcceptedTurn, error) {
	msg, err := schemas.Decode[schemas.InboundMessage](data)
	if err != nil {
		return nil, err
	}
	// The transport token is the publisher's identity (NATS permissions
	// give each transport its own subjects); the body may not claim
	// another. The session token must be the body's session key, or the
	// executor's arrival-order check would look in the wrong place.
	// A message of the previous version's subject (topology.LegacyInboundSubject)
	// is admitted too: its turn still gets the transport-scoped session.
	if want := topology.InboundSubject(msg.Transport, msg.SessionID); subject != want && subject != topology.LegacyInboundSubject(msg.Transport, msg.SessionID) {
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "message claims transport %q and session %q but arrived on %s (want %s)",
			msg.Transport, msg.SessionID, subject, want)
	}
	return Accept(msg, p, prov)
}

// Accept is the part of Admit that follows decoding: it builds the accepted
// turn of the decoded message msg under policy p, with its TurnContext not
// yet sealed (the stage seals it with its key ring before publishing; see
// package seal). prov supplies the stream-derived provenance (sequence,
// receipt time, instance); its Transport and MessageID are filled from msg.
// It fails with a *schemas.Error (ARGS_INVALID_JSON, PAYLOAD_TOO_LARGE,
// INVALID_INPUT, TURN_CONTEXT_INVALID) for input that cannot become a turn.
func Accept(msg *schemas.InboundMessage, p *policy.Policy, prov schemas.Provenance) (*schemas.AcceptedTurn, error) {
	audience, err := AudienceOf(msg.Channel.Kind)
	if err != nil {
		return nil, err
	}
	turnID := schemas.TurnID(msg.Transport, msg.MessageID)
	rule := p.Transport(msg.Transport)
	prov.Transport, prov.MessageID = msg.Transport, msg.MessageID
	if prov.ReceivedAt.IsZero() {
		prov.ReceivedAt = msg.SentAt.UTC()
	}
	tc := &schemas.TurnContext{
		V:          schemas.TurnContextVersion,
		SessionID:  msg.SessionID,
		SessionKey: schemas.SessionKey(msg.Transport, msg.SessionID),
		TurnID:     turnID,
		Requester: schemas.Requester{
			Principal: schemas.Principal(msg.Transport, msg.Sender.ID),
			SenderID:  msg.Sender.ID, Display: msg.Sender.Display,
			Kind: msg.Sender.Kind, Verified: msg.Sender.Verified,
		},
		Transport:     msg.Transport,
		Channel:       msg.Channel,
		Audience:      audience,
		TrustBoundary: rule.TrustBoundary,
		Interactive:   Interactive(rule, msg.Sender),
		Provenance:    prov,
		CreatedAt:     prov.ReceivedAt,
	}
	if err := tc.Check(); err != nil {
		return nil, err
	}
	calls := make([]schemas.ToolCall, len(msg.Calls))
	for i, c := range msg.Calls {
		canon, digest, err := schemas.CanonicalArgs(c.Args)
		if err != nil {
			return nil, callError(i, c.Tool, err)
		}
		calls[i] = schemas.ToolCall{CallID: schemas.CallID(turnID, i), Index: i, Tool: c.Tool, Args: canon, ArgsDigest: digest}
	}
	return &schemas.AcceptedTurn{TurnID: turnID, Context: tc, Text: msg.Text, Calls: calls, AcceptedAt: prov.ReceivedAt}, nil
}

// callError names call i in err, a coded error of schemas.CanonicalArgs,
// keeping its code once (not repeated inside the reason).
func callError(i int, tool string, err error) error {
	var e *schemas.Error
	if !errors.As(err, &e) {
		e = &schemas.Error{Code: schemas.CodeArgsInvalidJSON, Reason: err.Error()}
	}
	return &schemas.Error{Code: e.Code, Reason: fmt.Sprintf("call %d (%s): %s", i, tool, e.Reason), Err: err}
}

// Interactive reports whether sender can answer an approval prompt: a user
// whose identity the transport verified, on a transport whose policy rule
// allows prompts. It mirrors what the approver accepts from a decider, so a
// prompt is never emitted that the requester could not validly answer.
func Interactive(rule policy.TransportRule, sender schemas.Sender) bool {
	return rule.Interactive && sender.Kind == schemas.SenderUser && sender.Verified
}

// AudienceOf maps a channel kind to the audience of its turns (see
// schemas.AudienceOf).
func AudienceOf(k schemas.ChannelKind) (schemas.Audience, error) { return schemas.AudienceOf(k) }
