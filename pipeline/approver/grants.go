package approver

import (
	"cmp"
	"context"
	"errors"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"

	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/schemas"
)

// saveGrant makes and stores the grant that rec's decision (a grant
// option, already authorized by Authorize: the decider may decide the
// tool, and the policy offers the option for this call) creates, and
// publishes its created event. It runs after the compare-and-set that
// decided rec and before the decided event is published, and again on
// any redelivery of a decision with the same outcome: the grant's id is
// derived from the recorded decision, so exactly one grant exists per
// decided approval, and a grant exists only for a decision that won the
// compare-and-set. A grant the policy cannot make (a permanent error) is
// logged and skipped: the decision itself stands. Its error is transient.
func (a *Approver) saveGrant(ctx context.Context, rec *schemas.ApprovalRecord) error {
	g, err := grants.Make(rec, rec.Decision, a.cfg.Policy, a.cfg.Keys)
	if schemas.Permanent(err) {
		a.cfg.Logger.Warn("grant option chosen but no grant made", "approval", rec.ApprovalID, "option", rec.Decision.Option, "err", err)
		return nil
	}
	if err != nil {
		return err
	}
	created, err := grants.Save(ctx, a.cfg.JS, a.cfg.Store, g, a.now())
	if err != nil {
		return err
	}
	if created {
		a.grantsCreated.Inc()
	}
	a.cfg.Logger.Info("grant made", "grant", g.GrantID, "approval", rec.ApprovalID, "principal", g.Principal, "tool", g.Tool, "scope", g.Summary, "expires", g.ExpiresAt)
	return nil
}

// RevokeGrant carries out d, a revocation request (a Decision whose
// approval id is the grant's id and whose option is schemas.OptionRevoke):
// if policy.Policy.MayRevokeGrant lets its decider revoke the grant, the grant is revoked
// (grants.Revoke: marked by compare-and-set, its grant.revoked event
// published; a grant already revoked is left as it is and its event
// published again, deduplicated), recording the decider's principal.
// Otherwise a DecisionRejected with the code is published on the grant
// id's rejection subject: OPTION_NOT_OFFERED for another option,
// GRANT_NOT_FOUND, a seal code, DECIDER_NOT_AUTHORIZED. Its error is a
// transient one.
func (a *Approver) RevokeGrant(ctx context.Context, d *schemas.Decision) error {
	principal := schemas.Principal(d.Transport, d.Decider.ID)
	refuse := func(err error) error {
		a.decisions.WithLabelValues(string(schemas.CodeOf(err))).Inc()
		a.cfg.Logger.Info("grant revocation refused", "decision", d.DecisionID, "grant", d.ApprovalID, "principal", principal, "code", schemas.CodeOf(err), "err", err)
		rej := &schemas.DecisionRejected{DecisionID: d.DecisionID, ApprovalID: d.ApprovalID, Principal: principal,
			Code: schemas.CodeOf(err), Reason: schemas.ReasonOf(err), At: a.now()}
		return bus.Publish(ctx, a.cfg.JS, topology.EventSubject(topology.SubjectDecisionRejected, d.ApprovalID), topology.RejectedMsgID(d.DecisionID), rej)
	}
	if d.Option != schemas.OptionRevoke {
		return refuse(schemas.Errorf(schemas.CodeOptionNotOffered, "a decision on grant %s must be %q, not %q", d.ApprovalID, schemas.OptionRevoke, d.Option))
	}
	g, _, err := a.cfg.Store.Grants.Get(ctx, d.ApprovalID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return refuse(schemas.Errorf(schemas.CodeGrantNotFound, "no grant %s", d.ApprovalID))
	case schemas.Permanent(err):
		return refuse(err)
	case err != nil:
		return err
	}
	if err := a.cfg.Policy.MayRevokeGrant(g, d.Transport, d.Decider, d.Channel, a.cfg.Keys); err != nil {
		return refuse(err)
	}
	_, revoked, err := grants.Revoke(ctx, a.cfg.JS, a.cfg.Store, g.GrantID, principal, cmp.Or(d.Note, "revoked by "+principal), a.now())
	if err != nil {
		return err
	}
	if revoked {
		a.grantsRevoked.Inc()
		a.cfg.Logger.Info("grant revoked", "grant", g.GrantID, "by", principal)
	}
	return nil
}
