// Package approver is the stage that applies human decisions to pending
// approval records.
//
// A decision is applied only if, checked against the approval as persisted
// (its TurnContext and exact call) and the current policy: the approval
// exists, the decider is a verified user and authorized, the argument
// digest (if the decision carries one) is the one the approval binds, the
// option was offered, and the approval is still pending and not expired. The change is a
// compare-and-set on the record's KV revision, so of two concurrent
// decisions exactly one wins. A decision identical in effect to the one
// already applied is an idempotent success; any other decision on a decided
// approval is rejected with APPROVAL_ALREADY_DECIDED (or APPROVAL_EXPIRED).
// Every rejection is published on tollgate.event.decision.rejected.<id> so
// the sender can be told; every applied decision on
// tollgate.event.approval.decided.<turn>.
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

	"github.com/tollgate-dev/tollgate/jetstream/topology"
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
	Concurrency int                   // default 8
	Now         func() time.Time      // default time.Now
}

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
}

// New returns an Approver.
func New(cfg Config) (*Approver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 8
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Approver{cfg: cfg, decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_decisions_total", Help: "Decisions processed by the approver, by result (applied, idempotent, or a rejection code).",
	}, []string{"result"})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(a.decisions); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	var err error
	if a.pending, err = NewPendingTracker(cfg.Store.Approvals.KV, cfg.Store.Approvals.DecodeValue, a.Expire, cfg.Now, cfg.Logger, cfg.Registerer); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	return a, nil
}

// Run consumes decisions until ctx is cancelled.
func (a *Approver) Run(ctx context.Context) error {
	r, err := runner.New(runner.Config{
		Stage:  Stage,
		Stream: topology.StreamDecisions,
		Consumer: jetstream.ConsumerConfig{
			Durable:       topology.ConsumerApprover,
			FilterSubject: topology.SubjectDecisionSubmit + ">",
		},
		Handler:     a.Handle,
		JS:          a.cfg.JS,
		Logger:      a.cfg.Logger,
		Metrics:     a.cfg.Metrics,
		Concurrency: a.cfg.Concurrency,
	})
	if err != nil {
		return err
	}
	trackCtx, stopTracking := context.WithCancel(ctx)
	tracked := runner.Background(trackCtx, a.cfg.Logger, "pending-approvals tracker (gauge and expiry)", a.pending.Run)
	err = r.Run(ctx)
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
	d, err := schemas.Decode[schemas.Decision](m.Data())
	if err != nil {
		return err
	}
	if want := topology.DecisionSubject(d.Transport, d.ApprovalID); m.Subject() != want {
		return schemas.Errorf(schemas.CodeInvalidInput, "decision for %s from transport %s arrived on %s, want %s", d.ApprovalID, d.Transport, m.Subject(), want)
	}
	return a.Apply(ctx, d)
}

// ExpiryPrincipal is the principal recorded on an approval that expired.
const ExpiryPrincipal = "tollgate:expiry"

// Expire moves approval id from pending to expired if its expiry has
// passed (compare-and-set), and publishes its decided event (status
// expired): that event tells the redriver to evaluate the batch, where the
// call gets an expired result, and tells transports the prompt can no
// longer be answered. It is idempotent: an approval already expired gets
// its event re-published (deduplicated by message id); one decided
// otherwise, or not yet due, is left alone.
func (a *Approver) Expire(ctx context.Context, id string) error {
	now := a.now()
	changed := false
	rec, _, err := a.cfg.Store.Approvals.Mutate(ctx, id, func(r *schemas.ApprovalRecord) error {
		changed = false
		if r.Status != schemas.ApprovalPending || r.ExpiresAt.IsZero() || now.Before(r.ExpiresAt) {
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
	case schemas.CodeOf(err) != "":
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
	// Published whether this call or an earlier one made the change: an
	// earlier attempt may have stored "expired" and then failed to publish
	// (the event has one message id per approval, so a repeat within the
	// dedupe window is stored once).
	return a.publishDecided(ctx, rec)
}

func (a *Approver) publishDecided(ctx context.Context, rec *schemas.ApprovalRecord) error {
	ev := &schemas.DecidedEvent{
		ApprovalID: rec.ApprovalID, TurnID: rec.TurnID, SessionID: rec.SessionID,
		Status: rec.Status, Decision: rec.Decision, At: a.now(), Votes: rec.Votes,
	}
	if rec.Decision != nil {
		ev.At = rec.Decision.DecidedAt
	}
	subj := topology.EventSubject(topology.SubjectApprovalDecided, rec.TurnID)
	return bus.Publish(ctx, a.cfg.JS, subj, "decided:"+rec.ApprovalID, ev)
}

// Apply applies d, publishing a decided event or a rejection. It returns an
// error only for transient failures (to be retried).
func (a *Approver) Apply(ctx context.Context, d *schemas.Decision) error {
	res, err := a.apply(ctx, d)
	if err != nil {
		return err
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
		if err := bus.Publish(ctx, a.cfg.JS, subj, "rejected:"+d.DecisionID, rej); err != nil {
			return err
		}
	}
	if res.decided != nil {
		if err := a.publishDecided(ctx, res.decided); err != nil {
			return err
		}
	}
	if res.rejected == nil && res.label != "" {
		a.decisions.WithLabelValues(res.label).Inc()
	}
	return nil
}

type result struct {
	rejected *schemas.Error          // publish a rejection
	decided  *schemas.ApprovalRecord // publish (or re-publish) its decided event
	label    string
}

func reject(code schemas.Code, format string, args ...any) (result, error) {
	return result{rejected: schemas.Errorf(code, format, args...)}, nil
}

func (a *Approver) now() time.Time { return a.cfg.Now().UTC() }

func (a *Approver) apply(ctx context.Context, d *schemas.Decision) (result, error) {
	principal := schemas.Principal(d.Transport, d.Decider.ID)
	for {
		if !schemas.ValidKey(d.ApprovalID) {
			return reject(schemas.CodeApprovalNotFound, "no approval %q", d.ApprovalID)
		}
		rec, rev, err := a.cfg.Store.Approvals.Get(ctx, d.ApprovalID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return reject(schemas.CodeApprovalNotFound, "no approval %q", d.ApprovalID)
		case schemas.CodeOf(err) != "":
			return reject(schemas.CodeOf(err), "approval %s cannot be read: %v", d.ApprovalID, err)
		case err != nil:
			return result{}, err
		}
		// Who may decide is read from the persisted context: it must be
		// the authentic one (sealed), or an edited record could name the
		// attacker as requester.
		if err := a.cfg.Keys.Verify(rec.Context); err != nil {
			return reject(schemas.CodeOf(err), "approval %s has no authentic TurnContext to authorize against: %v", d.ApprovalID, err)
		}
		if err := rec.Context.CheckFor(rec.TurnID); err != nil {
			return reject(schemas.CodeOf(err), "approval %s: %v", d.ApprovalID, err)
		}
		// Authority is a person the transport vouched for: an unverified
		// sender could be anyone claiming the id, and bots and services
		// cannot answer a prompt (schemas.SenderKind).
		if d.Decider.Kind != schemas.SenderUser || !d.Decider.Verified {
			return reject(schemas.CodeDeciderNotAuthorized, "%s is not a verified user (kind %q, verified %v)", principal, d.Decider.Kind, d.Decider.Verified)
		}
		// A decision made where more people can see it than the turn's
		// audience (a public channel answering a personal turn) would
		// leak the call; the turn's audience bounds where it is decided.
		if d.Channel != nil {
			where, err := schemas.AudienceOf(d.Channel.Kind)
			if err != nil || where.Wider(rec.Context.Audience) {
				return reject(schemas.CodeDeciderNotAuthorized, "decision posted in a %s channel for a %s turn", d.Channel.Kind, rec.Context.Audience)
			}
		}
		if err := a.cfg.Policy.MayDecide(rec.Tool, rec.Context, principal, d.Decider.Assurance()); err != nil {
			return reject(schemas.CodeDeciderNotAuthorized, "%v", err)
		}
		if d.ArgsDigest != "" && d.ArgsDigest != rec.ArgsDigest {
			return reject(schemas.CodeArgsDigestMismatch, "decision is for arguments %s, approval binds %s", d.ArgsDigest, rec.ArgsDigest)
		}
		if !rec.Offers(d.Option) {
			return reject(schemas.CodeOptionNotOffered, "option %q was not offered (offered: %v)", d.Option, rec.Options)
		}
		want := statusOf(d.Option)
		if rec.Status.Decided() {
			switch {
			case rec.Status == want:
				return result{decided: rec, label: "idempotent"}, nil
			case rec.Status == schemas.ApprovalExpired:
				// Re-publish the decided event too: if the expiry was saved
				// but its event was lost, this is how the batch learns of it.
				r, _ := reject(schemas.CodeApprovalExpired, "approval %s expired at %s", rec.ApprovalID, rec.ExpiresAt.Format(time.RFC3339))
				r.decided = rec
				return r, nil
			default:
				return reject(schemas.CodeApprovalAlreadyDecided, "approval %s is already %s", rec.ApprovalID, rec.Status)
			}
		}
		now := a.now()
		expired := !rec.ExpiresAt.IsZero() && !now.Before(rec.ExpiresAt)
		vote := schemas.DecisionInfo{DecisionID: d.DecisionID, Principal: principal, Option: d.Option, DecidedAt: now, Assurance: d.Decider.Assurance()}
		rec.Decision = &vote
		rec.Status = want
		counted := false
		// The quorum is the larger of the one recorded at the request and
		// the current policy's: a deploy that raised it applies to pending
		// approvals (the redriver would refuse a smaller one anyway).
		quorum := max(rec.Quorum, a.cfg.Policy.Quorum(rec.Tool, rec.Context))
		if want == schemas.ApprovalApproved && quorum > 1 && !expired {
			// Multi-approver: count distinct principals; the approval
			// stays pending until the quorum is reached.
			if slices.ContainsFunc(rec.Votes, func(v schemas.DecisionInfo) bool { return v.Principal == principal }) {
				return result{label: "idempotent"}, nil
			}
			rec.Votes = append(rec.Votes, vote)
			if len(rec.Votes) < quorum {
				rec.Status, rec.Decision, counted = schemas.ApprovalPending, nil, true
			}
		}
		if expired {
			rec.Status = schemas.ApprovalExpired
			rec.Decision = &schemas.DecisionInfo{Principal: ExpiryPrincipal, DecidedAt: now}
		}
		_, err = a.cfg.Store.Approvals.Update(ctx, rec.ApprovalID, rec, rev)
		if errors.Is(err, store.ErrConflict) {
			continue // someone else changed it: re-evaluate against the new state
		}
		if err != nil {
			return result{}, err
		}
		if expired {
			r, _ := reject(schemas.CodeApprovalExpired, "approval %s expired at %s", rec.ApprovalID, rec.ExpiresAt.Format(time.RFC3339))
			r.decided = rec
			return r, nil
		}
		if counted {
			a.cfg.Logger.Info("approval vote counted", "approval", rec.ApprovalID, "principal", principal, "votes", len(rec.Votes), "quorum", quorum)
			return result{label: "vote"}, nil
		}
		a.cfg.Logger.Debug("decision applied", "approval", rec.ApprovalID, "turn", rec.TurnID, "status", rec.Status, "principal", principal)
		return result{decided: rec, label: "applied"}, nil
	}
}

func statusOf(option string) schemas.ApprovalStatus {
	if option == schemas.OptionApprove {
		return schemas.ApprovalApproved
	}
	return schemas.ApprovalDenied
}

func tokenOr(id string) string {
	if schemas.ValidKey(id) {
		return id
	}
	return "invalid"
}
