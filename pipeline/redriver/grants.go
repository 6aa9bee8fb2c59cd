package redriver

import (
	"context"

	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/schemas"
)

// recheckGrant is the last check before a call that a standing grant
// approved runs (plan p says run): the grant is read again and must still
// be usable for the call now (grants.Recheck). A grant revoked, expired,
// no longer offered by the policy, gone, or not authentic turns the plan
// into a failed result with GRANT_REVOKED, GRANT_EXPIRED or GRANT_INVALID:
// the call does not run (unless its execution claim says it already did:
// run then looks the claim up, as for POLICY_CHANGED). A call a person
// approved is returned unchanged. The error is a transient one.
func (r *Redriver) recheckGrant(ctx context.Context, tc *schemas.TurnContext, call schemas.ToolCall, a *schemas.ApprovalRecord, p CallPlan) (CallPlan, error) {
	if a.Decision == nil || a.Decision.Grant == nil {
		return p, nil
	}
	eng := r.cfg.Engine
	err := grants.Recheck(ctx, r.cfg.Store, eng.Keys(), r.cfg.Policy, tc, call, a, eng.Now())
	switch {
	case err == nil:
		return p, nil
	case !schemas.Permanent(err):
		return p, err
	}
	return CallPlan{Status: schemas.ResultFailed, Code: schemas.CodeOf(err), Reason: schemas.ReasonOf(err)}, nil
}

func isGrantCode(c schemas.Code) bool {
	return c == schemas.CodeGrantRevoked || c == schemas.CodeGrantExpired || c == schemas.CodeGrantInvalid
}
