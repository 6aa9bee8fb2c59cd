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
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

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

// Run consumes inbound messages until ctx is cancelled.
func (in *Ingest) Run(ctx context.Context) error {
	r, err := runner.New(runner.Config{
		Stage:  Stage,
		Stream: topology.StreamInbound,
		Consumer: jetstream.ConsumerConfig{
			Durable:       topology.ConsumerIngest,
			FilterSubject: topology.SubjectInboundPrefix + ">",
		},
		Handler:     in.Handle,
		JS:          in.cfg.JS,
		Logger:      in.cfg.Logger,
		Metrics:     in.cfg.Metrics,
		Concurrency: in.cfg.Concurrency,
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// Handle accepts one inbound message.
func (in *Ingest) Handle(ctx context.Context, m jetstream.Msg) error {
	msg, err := schemas.Decode[schemas.InboundMessage](m.Data())
	if err != nil {
		return err
	}
	// The transport token is the publisher's identity (NATS permissions
	// give each transport its own subjects); the body may not claim
	// another. The session token must be the body's session key, or the
	// executor's arrival-order check would look in the wrong place.
	if want := topology.InboundSubject(msg.Transport, msg.SessionID); m.Subject() != want {
		return schemas.Errorf(schemas.CodeInvalidInput, "message claims transport %q and session %q but arrived on %s (want %s)",
			msg.Transport, msg.SessionID, m.Subject(), want)
	}
	var prov schemas.Provenance
	if meta, err := m.Metadata(); err == nil {
		prov.StreamSeq, prov.ReceivedAt = meta.Sequence.Stream, meta.Timestamp.UTC()
	}
	prov.IngestedBy = in.cfg.Instance
	t, err := Accept(msg, in.cfg.Policy, prov)
	if err != nil {
		return err
	}
	if err := in.cfg.Keys.Seal(t.Context); err != nil {
		return err
	}
	subj := topology.AcceptedSubject(schemas.SessionKey(t.Context.SessionID))
	if err := bus.Publish(ctx, in.cfg.JS, subj, t.TurnID, t); err != nil {
		return err
	}
	in.cfg.Logger.Debug("turn accepted", "turn", t.TurnID, "session", t.Context.SessionID,
		"principal", t.Context.Requester.Principal, "audience", t.Context.Audience, "calls", len(t.Calls))
	return nil
}

// Accept builds the accepted turn of msg under policy p, with its
// TurnContext not yet sealed (the stage seals it with its key ring before
// publishing; see package seal). prov supplies the
// stream-derived provenance (sequence, receipt time, instance); its
// Transport and MessageID are filled from msg. It fails with a coded error
// (ARGS_INVALID_JSON, INVALID_INPUT) for input that cannot become a turn.
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
		V:         schemas.TurnContextVersion,
		SessionID: msg.SessionID,
		TurnID:    turnID,
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
			return nil, schemas.Errorf(schemas.CodeOf(err), "call %d (%s): %v", i, c.Tool, err)
		}
		calls[i] = schemas.ToolCall{CallID: schemas.CallID(turnID, i), Index: i, Tool: c.Tool, Args: canon, ArgsDigest: digest}
	}
	return &schemas.AcceptedTurn{TurnID: turnID, Context: tc, Text: msg.Text, Calls: calls, AcceptedAt: prov.ReceivedAt}, nil
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
