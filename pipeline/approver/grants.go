package approver

import (
	"context"

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
