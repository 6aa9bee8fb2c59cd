// Package ingest is the stage that accepts chat-transport messages as turns.
//
// For each inbound message it validates the payload, canonicalises the
// proposed calls' arguments, and builds the turn's TurnContext exactly once,
// from the message and the transport's policy rule: the requester's
// principal, channel and thread, audience (dm -> personal, private -> team,
// public -> public: there is no default), trust boundary, whether the
// requester can answer approval prompts, and provenance. The accepted turn
// is appended to its session's order (package jetstream/turnorder, message
// id topology.OrderMsgID of the turn id): the one sequence in which the
// session's turns run, each entry naming the one before it. The turn id
// is derived from (transport, message id), so a redelivered or re-sent
// message is the same turn. The TurnContext's times come from the stored message (its stream
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
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnorder"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/sessionorder"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tracing"
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
	Concurrency int    // default 16 (see executor.Config.Concurrency)
	// Plan routes turns with text and no calls to the planner
	// (topology.PlanSubject) instead of the executor; a turn with calls
	// always goes to the executor. With Plan, ingest also takes the
	// planner's step batches to the accepted subject (HandleStep, on
	// topology.IngestStepsConsumer). Set where a planner runs.
	Plan bool
	// TracerProvider traces each message the stage handles
	// (runner.Config.TracerProvider); nil is otel's global provider.
	TracerProvider trace.TracerProvider
	// Registerer gets the session-order metrics (sessionorder.Gate); nil
	// registers nothing.
	Registerer prometheus.Registerer
	// OrderWait is how long an earlier inbound message of a session that
	// has not joined its order holds later ones back (sessionorder's
	// wait; zero is sessionorder.DefaultWait).
	OrderWait time.Duration
	// Now is the clock the order wait is measured with (nil: time.Now).
	Now func() time.Time
}

// Validate reports missing wiring.
func (c Config) Validate() error {
	if c.JS == nil || c.Policy == nil || c.Keys == nil || c.Logger == nil || c.Metrics == nil || c.Instance == "" {
		return errors.New("ingest: JS, Policy, Keys, Logger, Metrics and Instance are required")
	}
	return nil
}

// Ingest is the ingest stage.
type Ingest struct {
	cfg  Config
	gate *sessionorder.Gate

	orders *turnorder.Lazy // the sessions' orders, made on first use
}

// New returns an Ingest.
func New(cfg Config) (*Ingest, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	gate, err := sessionorder.NewGate(sessionorder.GateConfig{JS: cfg.JS, Policy: cfg.Policy, Now: cfg.Now, Logger: cfg.Logger,
		Registerer: cfg.Registerer, Wait: cfg.OrderWait, Consumer: topology.ConsumerIngest})
	if err != nil {
		return nil, err
	}
	return &Ingest{cfg: cfg, gate: gate, orders: turnorder.NewLazy(cfg.JS)}, nil
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
			Component:      Stage,
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

// Handle accepts one inbound message: it applies the admission rule
// (policy.(*Policy).Admit), seals the turn's TurnContext and appends the
// accepted turn to its session's order (jetstream/turnorder: kind
// topology.OrderPlan when Config.Plan is set and the turn has text and no
// calls, topology.OrderExec otherwise), with the inbound message's
// stream sequence as its arrival, once every earlier inbound message of
// its session has joined the order or never will (sessionorder.Gate:
// otherwise an *sessionorder.OutOfOrder, a waiting error, and the message
// is tried again shortly). Admit's coded errors are permanent (the runner
// dead-letters the message), and so is a turn too large to store
// (PAYLOAD_TOO_LARGE); sealing and appending errors are retried: the
// append recognises an earlier attempt of itself (turnorder's contract),
// so a redelivered message is one entry.
func (in *Ingest) Handle(ctx context.Context, m jetstream.Msg) error {
	var prov schemas.Provenance
	if meta, err := m.Metadata(); err == nil {
		prov.StreamSeq, prov.ReceivedAt = meta.Sequence.Stream, meta.Timestamp.UTC()
	}
	prov.IngestedBy = in.cfg.Instance
	t, err := in.cfg.Policy.Admit(m.Subject(), m.Data(), prov)
	if err != nil {
		return err
	}
	if err := in.cfg.Keys.Seal(t.Context); err != nil {
		return err
	}
	kind := topology.OrderExec
	if in.cfg.Plan && len(t.Calls) == 0 && t.Text != "" {
		kind = topology.OrderPlan
	}
	data, err := schemas.Encode(t)
	if err != nil {
		return err
	}
	w, err := in.orders.Get(ctx)
	if err != nil {
		return err
	}
	key := schemas.SessionKeyOf(t.Context)
	if err := in.inArrivalOrder(ctx, w, key, t); err != nil {
		return err
	}
	a := turnorder.Append{Kind: kind, Key: key, Turn: t.TurnID, Arrival: prov.StreamSeq, Data: data, Header: tracing.Inject(ctx, nil)}
	e, err := w.Append(ctx, a)
	if err == nil && prov.StreamSeq > e.Arrival {
		// The turn joined the order from an earlier delivery of its
		// message (a transport's retry under another message id, inside
		// the duplicate window): this delivery must raise the session's
		// watermark too, or later messages would wait behind it.
		a.Repeat = true
		e, err = w.Append(ctx, a)
	}
	if err != nil {
		if bus.TooLarge(err) {
			return schemas.Errorf(schemas.CodePayloadTooLarge, "accept turn %s: %w", t.TurnID, err)
		}
		return fmt.Errorf("accept turn %s: %w", t.TurnID, err)
	}
	in.cfg.Logger.Debug("turn accepted", "turn", t.TurnID, "session", t.Context.SessionID, "kind", kind, "after", e.After,
		"principal", t.Context.Requester.Principal, "audience", t.Context.Audience, "calls", len(t.Calls))
	return nil
}

// inArrivalOrder returns nil when t may join its session's order now
// (sessionorder.Gate), leaving w's memory of the session as the append
// after it should name: the session's watermark is what w remembers;
// else, when no inbound message of the session is stored before t's own
// (a new session), there is nothing to wait for and the order is assumed
// empty without a read (a wrong assumption, an entry of a turn whose
// inbound message the stream no longer keeps, is refused by the append's
// compare-and-set, which reads the order and appends after it); else the
// order is read. A turn told to wait has w forget the session, as
// another replica may have appended since.
func (in *Ingest) inArrivalOrder(ctx context.Context, w *turnorder.Writer, key string, t *schemas.AcceptedTurn) error {
	watermark, known := w.Known(key)
	if !known {
		fresh, err := in.gate.Earliest(ctx, t)
		if err != nil {
			return err
		}
		if fresh {
			w.AssumeNew(key)
			return nil
		}
		if watermark, err = w.Watermark(ctx, key); err != nil {
			return err
		}
	}
	err := in.gate.Check(ctx, t, watermark)
	var wait *sessionorder.OutOfOrder
	if errors.As(err, &wait) {
		w.Forget(key)
	}
	return err
}

// Admit is the admission rule, whose one home is policy.(*Policy).Admit:
// whether the inbound message data, stored on subject, becomes a turn
// under p, and which turn. The stage calls it on every message; the
// function stays here for the callers that name it ingest's rule.
func Admit(subject string, data []byte, p *policy.Policy, prov schemas.Provenance) (*schemas.AcceptedTurn, error) {
	return p.Admit(subject, data, prov)
}

// Accept is policy.(*Policy).Accept: the part of Admit that follows
// decoding, building the accepted turn of msg under p, its TurnContext
// not yet sealed.
func Accept(msg *schemas.InboundMessage, p *policy.Policy, prov schemas.Provenance) (*schemas.AcceptedTurn, error) {
	return p.Accept(msg, prov)
}

// Interactive is policy.TransportRule.Prompts: whether sender can answer
// an approval prompt under rule.
func Interactive(rule policy.TransportRule, sender schemas.Sender) bool { return rule.Prompts(sender) }

// AudienceOf maps a channel kind to the audience of its turns (see
// schemas.AudienceOf).
func AudienceOf(k schemas.ChannelKind) (schemas.Audience, error) { return schemas.AudienceOf(k) }
