// Package approver is the stage that applies human decisions to pending
// approval records.
//
// A decision is applied only if, checked against the approval as persisted
// (its TurnContext and exact call) and the current policy: the approval
// exists, the decider is a verified user and authorized, the argument
// digest (if the decision carries one) is the one the approval binds, the
// option was offered, and the approval is still pending and not expired.
// These checks are one pure function, Authorize (its decider part is
// MayDecide); the stage only reads, stores and publishes. The change is a
// compare-and-set on the record's KV revision, so of two concurrent
// decisions exactly one wins. A decision identical in effect to the one
// already applied is an idempotent success; any other decision on a decided
// approval is rejected with APPROVAL_ALREADY_DECIDED (or APPROVAL_EXPIRED).
// Every rejection is published on tollgate.event.decision.rejected.<id> so
// the sender can be told. An applied decision is its compare-and-set: the
// approval record's revision that holds it decided is the decision's
// event (docs/protocol.md §4.2b; store.DecidedOf), which the redriver and
// every other reader consume from the bucket's stream, and nothing else
// is published for it. A decision that changes no record (an idempotent
// success: the recorded outcome repeated, or a decision applied before
// and delivered again) is answered on tollgate.event.approval.decided.<turn>,
// the recorded decision with DecidedEvent.Repeat set to its id.
package approver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Stage is the approver's stage name.
const Stage = "approver"

// Config wires an Approver.
type Config struct {
	JS          jetstream.JetStream
	Store       *store.Store
	Policy      *policy.Policy
	Keys        *seal.KeyRing // verifies the approval's TurnContext before it is used to authorize
	Logger      *slog.Logger
	Metrics     *runner.Metrics
	Registerer  prometheus.Registerer // may be nil
	Concurrency int                   // default 32 (see executor.Config.Concurrency)
	Now         func() time.Time      // default time.Now
	// TracerProvider traces each message the stage handles
	// (runner.Config.TracerProvider); nil is otel's global provider.
	TracerProvider trace.TracerProvider
	// NotFoundGrace is how long after a decision was stored on
	// TOLLGATE_DECISIONS a missing approval record is taken for a read
	// that is not current yet rather than for an unknown approval: the
	// decision is tried again (a transient failure, redelivered with
	// backoff) until it is that old, and only then rejected
	// APPROVAL_NOT_FOUND. A decision request whose approval is missing is
	// handed back (submit.NotTaken), to be stored and so handled the same
	// way. Zero rejects at once.
	//
	// Set it when the approvals bucket has more than one replica
	// (tollgate.New: DefaultNotFoundGrace): for some seconds after its
	// stream's leader changes, a read can be answered from a store that
	// has not applied every acknowledged write yet (cluster-test seed
	// 312694565: five decisions rejected APPROVAL_NOT_FOUND for approvals
	// every replica held afterwards, their turns lost). With one replica
	// there is no such read, and a missing record is unknown.
	NotFoundGrace time.Duration
}

// DefaultNotFoundGrace is NotFoundGrace on a cluster.
const DefaultNotFoundGrace = 30 * time.Second

// Validate reports missing wiring.
func (c Config) Validate() error {
	if c.JS == nil || c.Store == nil || c.Policy == nil || c.Keys == nil || c.Logger == nil || c.Metrics == nil {
		return errors.New("approver: JS, Store, Policy, Keys, Logger and Metrics are required")
	}
	return nil
}

// Approver is the approver stage.
type Approver struct {
	cfg       Config
	decisions *prometheus.CounterVec
	pending   *PendingTracker
	// grantsCreated counts the grants this approver's decisions made
	// (once each, not again on a redelivery).
	grantsCreated prometheus.Counter
	grantsRevoked prometheus.Counter
}

// New returns an Approver.
func New(cfg Config) (*Approver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Approver{cfg: cfg, decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_decisions_total", Help: "Decisions processed by the approver, by result (applied, idempotent, or a rejection code).",
	}, []string{"result"}), grantsCreated: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tollgate_grants_created_total", Help: "Standing grants made by the approver (a decision with a grant option).",
	}), grantsRevoked: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tollgate_grants_revoked_total", Help: "Standing grants revoked (each once).",
	})}
	if err := metrics.Register(cfg.Registerer, &a.grantsRevoked); err != nil {
		return nil, err
	}
	if err := metrics.Register(cfg.Registerer, &a.decisions); err != nil {
		return nil, err
	}
	if err := metrics.Register(cfg.Registerer, &a.grantsCreated); err != nil {
		return nil, err
	}
	var err error
	if a.pending, err = NewPendingTracker(cfg.Store.Approvals.KV, cfg.Store.Approvals.DecodeValue, a.Expire, cfg.Now, cfg.Logger, cfg.Registerer); err != nil {
		return nil, err
	}
	return a, nil
}

// Run consumes decisions until ctx is cancelled, and answers decisions
// sent as requests (DecideService) meanwhile.
func (a *Approver) Run(ctx context.Context) error {
	consumer := topology.ApproverConsumer()
	r, err := runner.New(runner.Config{
		Component:      Stage,
		Stream:         consumer.Stream,
		Consumer:       consumer.Config,
		Handler:        a.Handle,
		JS:             a.cfg.JS,
		Logger:         a.cfg.Logger,
		Metrics:        a.cfg.Metrics,
		Concurrency:    a.cfg.Concurrency,
		TracerProvider: a.cfg.TracerProvider,
	})
	if err != nil {
		return err
	}
	trackCtx, stopTracking := context.WithCancel(ctx)
	tracked := runner.Background(trackCtx, a.cfg.Logger, "pending-approvals tracker (gauge and expiry)", a.pending.Run)
	stopServing, err := a.serveDecisions()
	if err != nil {
		stopTracking()
		tracked()
		return err
	}
	err = r.Run(ctx)
	stopServing()
	stopTracking()
	tracked()
	return err
}

// Handle processes one decision message. A decision that does not decode,
// or whose subject (tollgate.decision.submit.<transport>.<approval id>) does
// not match its body, is returned as a coded error: the runner dead-letters
// it with its original bytes. Such a message has no trustworthy sender to
// address a rejection to.
func (a *Approver) Handle(ctx context.Context, m jetstream.Msg) error {
	d, err := decodeOn(m.Data(), m.Subject(), topology.DecisionSubject)
	if err != nil {
		return err
	}
	if schemas.IsGrantID(d.ApprovalID) {
		return a.RevokeGrant(ctx, d)
	}
	_, err = a.decide(ctx, d, a.missingIsFinal(m))
	return err
}

// missingIsFinal reports whether a missing approval record rejects the
// decision in m, a decision request when m is nil (Config.NotFoundGrace):
// at once without a grace; on a request never with one (it is handed
// back, and so stored); on the stream once m was stored the grace ago.
// The message's metadata is read only where there is a grace.
func (a *Approver) missingIsFinal(m jetstream.Msg) bool {
	if a.cfg.NotFoundGrace == 0 {
		return true
	}
	if m == nil {
		return false
	}
	md, err := m.Metadata()
	return err != nil || a.now().Sub(md.Timestamp) >= a.cfg.NotFoundGrace
}

// errNotFoundYet is the transient failure of a decision whose approval
// record is missing within Config.NotFoundGrace.
var errNotFoundYet = errors.New("approval record not found yet: a replica may not be current")

// decodeOn decodes the decision data that arrived on subject, which must
// be subjectOf its own transport and approval (topology.DecisionSubject
// on the stream, topology.DecideSubject as a request): the subject's
// transport token is the sender's identity, so a body naming another
// transport or approval is INVALID_INPUT. Its error has a code.
func decodeOn(data []byte, subject string, subjectOf func(transport, approvalID string) string) (*schemas.Decision, error) {
	d, err := schemas.Decode[schemas.Decision](data)
	if err != nil {
		return nil, err
	}
	if want := subjectOf(d.Transport, d.ApprovalID); subject != want {
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "decision for %s from transport %s arrived on %s, want %s", d.ApprovalID, d.Transport, subject, want)
	}
	return d, nil
}

// ExpiryPrincipal is the principal recorded on an approval that expired.
const ExpiryPrincipal = "tollgate:expiry"

// Expire moves approval id from pending to expired if its expiry has
// passed (compare-and-set). That revision is its decided event (status
// expired): it tells the redriver to evaluate the batch, where the call
// gets an expired result, and tells transports the prompt can no longer
// be answered. It is idempotent: an approval already expired, decided
// otherwise, or not yet due is left alone.
func (a *Approver) Expire(ctx context.Context, id string) error {
	now := a.now()
	changed := false
	rec, _, err := a.cfg.Store.Approvals.Mutate(ctx, id, func(r *schemas.ApprovalRecord) error {
		changed = false
		// Only a pending approval that is no longer decidable is due.
		if r.Status != schemas.ApprovalPending || r.Decidable(now) == nil {
			return store.ErrSkip
		}
		changed = true
		r.Status = schemas.ApprovalExpired
		r.Decision = &schemas.DecisionInfo{Principal: ExpiryPrincipal, DecidedAt: now}
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case schemas.Permanent(err):
		a.cfg.Logger.Warn("cannot expire an unreadable approval record", "approval", id, "err", err)
		return nil // a redrive of its batch fails closed on it
	case err != nil:
		return err
	}
	if rec.Status != schemas.ApprovalExpired {
		return nil
	}
	if changed {
		a.cfg.Logger.Info("approval expired", "approval", id, "turn", rec.TurnID, "expired_at", rec.ExpiresAt)
		a.decisions.WithLabelValues("expired_unanswered").Inc()
	}
	return nil
}

// publishAnswer answers decision id, which changed no record (an
// idempotent success), on the decided subject of decided record rec: the
// recorded decision, Repeat set to id (message id topology.RepeatMsgID, one
// per decision).
func (a *Approver) publishAnswer(ctx context.Context, rec *schemas.ApprovalRecord, id string) error {
	ev := schemas.DecidedOf(rec)
	if ev == nil {
		return fmt.Errorf("approver: answer decision %s on approval %s: it is %s, not decided", id, rec.ApprovalID, rec.Status)
	}
	ev.Repeat = id
	subj := topology.EventSubject(topology.SubjectApprovalDecided, rec.TurnID)
	return bus.Publish(ctx, a.cfg.JS, subj, topology.RepeatMsgID(rec.ApprovalID, id), ev)
}

// publishVoted announces the quorum vote of decision id that rec counts
// (tollgate.event.approval.voted.<turn>): the vote and every vote so far.
// Nothing when rec holds no vote of that decision.
func (a *Approver) publishVoted(ctx context.Context, rec *schemas.ApprovalRecord, id string) error {
	i := slices.IndexFunc(rec.Votes, func(v schemas.DecisionInfo) bool { return v.DecisionID == id })
	if i < 0 {
		return nil
	}
	ev := &schemas.VotedEvent{
		ApprovalID: rec.ApprovalID, TurnID: rec.TurnID, SessionID: rec.SessionID,
		Vote: rec.Votes[i], Votes: rec.Votes, Quorum: max(rec.Quorum, 1), At: rec.Votes[i].DecidedAt,
	}
	subj := topology.EventSubject(topology.SubjectApprovalVoted, rec.TurnID)
	return bus.Publish(ctx, a.cfg.JS, subj, topology.VotedMsgID(rec.ApprovalID, id), ev)
}

// Apply applies d: its compare-and-set, or a rejection published, or, for
// an idempotent success, its answer (publishAnswer). It returns an error
// only for transient failures (to be retried).
func (a *Approver) Apply(ctx context.Context, d *schemas.Decision) error {
	_, err := a.decide(ctx, d, true)
	return err
}

// decide is Apply, returning what the decision did: its Effect, or its
// rejection (a *schemas.Error, whose rejection is published). Unless
// missingIsFinal, a decision whose approval record is missing is not
// rejected but fails with errNotFoundYet (Config.NotFoundGrace).
func (a *Approver) decide(ctx context.Context, d *schemas.Decision, missingIsFinal bool) (result, error) {
	res, err := a.apply(ctx, d)
	if err != nil {
		return res, err
	}
	if res.missing && !missingIsFinal {
		return result{}, fmt.Errorf("decision %s on %s: %w", d.DecisionID, d.ApprovalID, errNotFoundYet)
	}
	if res.rejected != nil {
		a.decisions.WithLabelValues(string(res.rejected.Code)).Inc()
		a.cfg.Logger.Info("decision rejected", "decision", d.DecisionID, "approval", d.ApprovalID, "code", res.rejected.Code, "reason", res.rejected.Reason)
		rej := &schemas.DecisionRejected{
			DecisionID: d.DecisionID, ApprovalID: d.ApprovalID,
			Principal: schemas.Principal(d.Transport, d.Decider.ID),
			Code:      res.rejected.Code, Reason: res.rejected.Reason, At: a.now(),
		}
		subj := topology.EventSubject(topology.SubjectDecisionRejected, tokenOr(d.ApprovalID))
		if err := bus.Publish(ctx, a.cfg.JS, subj, topology.RejectedMsgID(d.DecisionID), rej); err != nil {
			return res, err
		}
	}
	if res.answered != nil {
		if err := a.publishAnswer(ctx, res.answered, d.DecisionID); err != nil {
			return res, err
		}
	}
	if res.voted != nil {
		if err := a.publishVoted(ctx, res.voted, d.DecisionID); err != nil {
			return res, err
		}
	}
	if res.rejected == nil && res.label != "" {
		a.decisions.WithLabelValues(res.label).Inc()
	}
	return res, nil
}

type result struct {
	rejected *schemas.Error          // publish a rejection
	answered *schemas.ApprovalRecord // the decision changed no record: answer it (publishAnswer)
	voted    *schemas.ApprovalRecord // publish (or re-publish) the voted event of the decision
	label    string
	missing  bool // rejected because no record of a well-formed approval id was found
}

func reject(code schemas.Code, format string, args ...any) (result, error) {
	return result{rejected: schemas.Errorf(code, format, args...)}, nil
}

func (a *Approver) now() time.Time { return a.cfg.Now().UTC() }

// apply reads the approval d names, asks Authorize what d does, stores its
// verdict by compare-and-set (on a conflict it reads again and asks again)
// and returns what to publish. Its error is a transient one.
//
// The record is first taken from the pending tracker's watch
// (PendingTracker.Latest), when it holds the approval's last revision it
// delivered, instead of read from the bucket: one read fewer per decision.
// Only a verdict that writes is acted on from it, and that write is a
// compare-and-set at the watched revision, which fails if the record
// changed since (a stale watch), so nothing is decided on a record that
// is not current. Every other verdict (a rejection, a repeat) and every
// attempt after a conflict is made on a fresh read.
func (a *Approver) apply(ctx context.Context, d *schemas.Decision) (result, error) {
	fresh := false
	for {
		var rec *schemas.ApprovalRecord
		var rev uint64
		watched := false
		if schemas.ValidKey(d.ApprovalID) { // otherwise there is no such record
			if !fresh {
				rec, rev, watched = a.pending.Latest(d.ApprovalID)
			}
			if !watched {
				var err error
				rec, rev, err = a.cfg.Store.Approvals.Get(ctx, d.ApprovalID)
				switch {
				case errors.Is(err, store.ErrNotFound):
					rec = nil
				case schemas.Permanent(err):
					return reject(schemas.CodeOf(err), "approval %s cannot be read: %v", d.ApprovalID, err)
				case err != nil:
					return result{}, err
				}
			}
		}
		v, rejected := Authorize(rec, d, a.cfg.Policy, a.cfg.Keys, a.now())
		if watched && v.Next == nil {
			fresh = true // decided on a fresh read only
			continue
		}
		if v.Next != nil {
			_, err := a.cfg.Store.Approvals.Update(ctx, v.Next.ApprovalID, v.Next, rev)
			if errors.Is(err, store.ErrConflict) {
				fresh = true
				continue // someone else changed it: re-evaluate against the new state
			}
			if err != nil {
				return result{}, err
			}
			rec = v.Next
		}
		res := result{label: string(v.Effect), missing: rec == nil && schemas.ValidKey(d.ApprovalID)}
		if rejected != nil && !errors.As(rejected, &res.rejected) {
			return result{}, fmt.Errorf("approver: rejection without a code: %w", rejected) // Authorize's are *schemas.Error
		}
		if rejected == nil && v.Effect == Idempotent && rec != nil && rec.Status.Decided() {
			// No record changed (a repeat of the recorded outcome, by its
			// decider or anyone else authorized, or a decision applied
			// before and delivered again): no revision answers its sender,
			// so the approver does (DecidedEvent.Answers).
			res.answered = rec
		}
		if rejected == nil && rec != nil && rec.Status == schemas.ApprovalPending && (v.Effect == Vote || v.Effect == Idempotent) {
			// A counted vote (or its redelivery: the event's message id
			// makes a repeat one event) is announced.
			res.voted = rec
		}
		if rejected == nil && (v.Effect == Applied || v.Effect == Idempotent) {
			// Made before the decided event is published, and again on a
			// redelivery (the same grant: its id is the recorded
			// decision's).
			if err := a.makeGrant(ctx, rec); err != nil {
				return result{}, err
			}
		}
		switch {
		case rejected != nil:
		case v.Effect == Vote:
			a.cfg.Logger.Info("approval vote counted", "approval", rec.ApprovalID, "principal", schemas.Principal(d.Transport, d.Decider.ID), "votes", len(rec.Votes), "quorum", v.Quorum)
		case v.Effect == Applied:
			a.cfg.Logger.Debug("decision applied", "approval", rec.ApprovalID, "turn", rec.TurnID, "status", rec.Status, "principal", schemas.Principal(d.Transport, d.Decider.ID))
		}
		return res, nil
	}
}

// makeGrant makes the standing grant of rec's decision, when rec was
// decided with a grant option (grants.go).
func (a *Approver) makeGrant(ctx context.Context, rec *schemas.ApprovalRecord) error {
	if !rec.Status.Decided() || rec.Decision == nil || rec.Decision.Grant != nil || !schemas.IsGrantOption(rec.Decision.Option) {
		return nil
	}
	return a.saveGrant(ctx, rec)
}

func tokenOr(id string) string {
	if schemas.ValidKey(id) {
		return id
	}
	return "invalid"
}
