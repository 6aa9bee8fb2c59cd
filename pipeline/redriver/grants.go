package redriver

import (
	"context"
	"time"

	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// RecheckGrant is the last check before a call that a standing grant
// approved runs (plan p, from PlanCall, says run): the grant is read again
// from st and must still be usable for the call at now under keys and pol
// (grants.Recheck). A grant revoked, expired, no longer offered by the
// policy, gone (or its bucket missing: st.Grants.KV nil), or not authentic
// turns the plan into a failed result with GRANT_REVOKED, GRANT_EXPIRED
// or GRANT_INVALID: the call does not run (unless its execution claim
// says it already did: the caller looks the claim up, as for
// POLICY_CHANGED; IsGrantCode). A plan that does not run, or a call a
// person approved, is returned unchanged. The error is a transient one.
//
// The redriver and replay's shadow redrive (pipeline/replay) both use it,
// so that a dry run reports what a redrive would do.
func RecheckGrant(ctx context.Context, st *store.Store, keys *seal.KeyRing, pol *policy.Policy, tc *schemas.TurnContext, call schemas.ToolCall, a *schemas.ApprovalRecord, p CallPlan, now time.Time) (CallPlan, error) {
	if !p.Run || a.Decision == nil || a.Decision.Grant == nil {
		return p, nil
	}
	var err error
	if st == nil || st.Grants.KV == nil {
		err = schemas.Errorf(schemas.CodeGrantRevoked, "grant %s that approved this call is gone: there is no grants bucket", a.Decision.Grant.GrantID)
	} else {
		err = grants.Recheck(ctx, st, keys, pol, tc, call, a, now)
	}
	switch {
	case err == nil:
		return p, nil
	case !schemas.Permanent(err):
		return p, err
	}
	return CallPlan{Status: schemas.ResultFailed, Code: schemas.CodeOf(err), Reason: schemas.ReasonOf(err)}, nil
}

// recheckGrant is RecheckGrant with the redriver's store, keys, policy and
// clock; a re-check that stops the call is counted by code
// (tollgate_grant_rechecks_failed_total).
func (r *Redriver) recheckGrant(ctx context.Context, tc *schemas.TurnContext, call schemas.ToolCall, a *schemas.ApprovalRecord, p CallPlan) (CallPlan, error) {
	eng := r.cfg.Engine
	q, err := RecheckGrant(ctx, r.cfg.Store, eng.Keys(), r.cfg.Policy, tc, call, a, p, eng.Now())
	if err == nil && p.Run && !q.Run {
		r.grantRechecks.WithLabelValues(string(q.Code)).Inc()
	}
	return q, err
}

// IsGrantCode reports whether c is one of the grant re-check's codes.
func IsGrantCode(c schemas.Code) bool {
	return c == schemas.CodeGrantRevoked || c == schemas.CodeGrantExpired || c == schemas.CodeGrantInvalid
}
