package executor

import (
	"context"

	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Standing grants on the approval-creation path (docs/protocol.md,
// "Grants"). Only a call that needs approval, from a turn with an
// interactive requester, gets here: calls that run at once or are denied
// by policy never look a grant up.
//
// A call that a live grant covers gets its approval record written
// already decided, by the grant (DecisionInfo.Grant), instead of pending:
// nobody is prompted. From there it goes the way of any decided approval:
// the batch waits, the redriver evaluates the barrier and, before an
// approved call runs, checks the grant again (revoked, expired, no longer
// offered: the call fails with GRANT_REVOKED or GRANT_EXPIRED and does
// not run). The executor never runs a grant-approved call inline: every
// approved call runs in the redriver, after the same checks as one a
// person approved.

// grantOrOffer completes rec, the new approval record of call, before it
// is created: the grant options the policy offers for the call are added
// to its options (with what each would cover), and if a usable grant
// covers the call, rec is decided by it. For a tool the policy offers no
// grant option for (policy.Policy.Grantable), no grant can be usable and
// none is looked up. The error is a transient one.
func (x *Executor) grantOrOffer(ctx context.Context, b *schemas.BatchRecord, call schemas.ToolCall, rec *schemas.ApprovalRecord) error {
	eng := x.cfg.Engine
	for _, o := range x.cfg.Policy.GrantOffers(call.Tool, b.Context, call.Args) {
		rec.Options = append(rec.Options, o.Option)
		rec.Grants = append(rec.Grants, o)
	}
	if !x.cfg.Policy.Grantable(call.Tool) {
		// No grant of this tool is usable under the policy (one made under
		// an earlier version that offered it is refused by StillGrants):
		// nothing to read.
		return nil
	}
	g, err := grants.Find(ctx, x.cfg.Store, eng.Keys(), x.cfg.Policy, b.Context, call.Tool, call.Args, eng.Now(),
		func(id string, why error) {
			x.cfg.Logger.Warn("grant not used", "grant", id, "call", call.CallID, "code", schemas.CodeOf(why), "err", why)
		})
	if err != nil || g == nil {
		return err
	}
	rec.Status, rec.Decision = g.Effect, grants.Decision(g, eng.Now())
	x.cfg.Logger.Info("approval decided by a standing grant", "approval", rec.ApprovalID, "grant", g.GrantID, "status", g.Effect, "principal", g.Principal)
	return nil
}

// announceGranted publishes what the record's creation, already decided
// (its revision is its decided event), does not say: the grant's used
// event; and for a batch whose log keeps no request (b kept in
// tollgate_batches), first the approval as stored on the requested
// subject, so the streams hold the record for replay (transports prompt
// only for a pending one). A log-kept batch's awaiting event keeps that
// record. Each carries a message id, so a redelivery publishes each once.
func (x *Executor) announceGranted(ctx context.Context, b *schemas.BatchRecord, rec *schemas.ApprovalRecord) error {
	js := x.cfg.JS
	if b.Bucketed() {
		if err := x.publishRequested(ctx, rec); err != nil {
			return err
		}
	}
	return grants.Publish(ctx, js, &schemas.GrantEvent{
		Kind: schemas.GrantUsed, GrantID: rec.Decision.Grant.GrantID, Tool: rec.Tool,
		ApprovalID: rec.ApprovalID, TurnID: rec.TurnID, CallID: rec.CallID, Status: rec.Status, At: rec.Decision.DecidedAt,
	})
}
