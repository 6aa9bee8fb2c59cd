package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/pipeline/legacy"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// Shadow is what the redriver would do with a batch now: the verdict of
// redriver.Evaluate and, for a batch it would start, what each call waiting
// on an approval would get (redriver.PlanCall and the call's execution
// claim, after the same grant re-check as the redriver's for a call a
// standing grant approved: redriver.RecheckGrant).
type Shadow struct {
	// Kind is started, deferred or failed; "none" for a terminal batch
	// (the redriver only publishes its outcome again if missing and frees
	// its session) or one whose record does not decode.
	Kind    string       `json:"kind"`
	Code    schemas.Code `json:"code,omitempty"`
	Reason  string       `json:"reason,omitempty"`
	Pending int          `json:"pending,omitempty"`
	Calls   []ShadowCall `json:"calls,omitempty"`
}

// What a shadowed call would do.
const (
	WouldRun         = "run"           // the tool would run (it has no execution claim)
	WouldNotRun      = "not run"       // a result without running: denied, expired, abandoned, POLICY_CHANGED, GRANT_*
	WouldNotRunAgain = "not run again" // it has an execution claim: it ran, runs elsewhere, or may have run
)

// ShadowCall is one call of a batch the redriver would start.
type ShadowCall struct {
	CallID     string               `json:"call_id"`
	Tool       string               `json:"tool"`
	ApprovalID string               `json:"approval_id"`
	Would      string               `json:"would"`
	Status     schemas.ResultStatus `json:"status,omitempty"` // the result it would get (for not run), or its claim's
	Code       schemas.Code         `json:"code,omitempty"`
	Reason     string               `json:"reason,omitempty"`
}

// shadowAll sets the Shadow of every turn of rep, judging each batch as a
// rebuild would leave it (the records rep holds per turn) under o.Keys and
// o.Policy. It reads KV (approvals a rebuild does not touch, claims) and
// writes nothing.
func shadowAll(ctx context.Context, b *buckets, o Options, rep *Report) error {
	compat, err := legacy.New(o.Keys, o.Logger, nil)
	if err != nil {
		return err
	}
	approvals := store.Bucket[schemas.ApprovalRecord, *schemas.ApprovalRecord]{KV: b.approvals, Decode: compat.DecodeApproval}
	claims := store.Bucket[schemas.ExecutionClaim, *schemas.ExecutionClaim]{KV: b.claims}
	// The grants bucket, for the grant re-check (only Grants is read).
	gst := &store.Store{Grants: store.Bucket[schemas.Grant, *schemas.Grant]{KV: b.grants}}
	for i := range rep.Turns {
		tr := &rep.Turns[i]
		if tr.rec == nil {
			tr.Shadow = &Shadow{Kind: "none", Reason: "the batch record (in its turn's log, or in KV) does not decode: the redriver dead-letters what triggers it"}
			continue
		}
		source := func(ctx context.Context, id string) (*schemas.ApprovalRecord, error) {
			if a := tr.recs[id]; a != nil {
				return a, nil
			}
			if b.approvals == nil {
				return nil, fmt.Errorf("approval %s: %w", id, store.ErrNotFound)
			}
			a, _, err := approvals.Get(ctx, id)
			return a, err
		}
		v, err := redriver.Evaluate(ctx, o.Keys, tr.rec, source)
		if err != nil {
			return fmt.Errorf("replay: shadow redrive of %s: %w", tr.TurnID, err)
		}
		s := &Shadow{Kind: string(v.Kind), Code: v.Code, Reason: v.Reason, Pending: v.Pending}
		if v.Kind == "" {
			s.Kind = "none"
		}
		if v.Kind == schemas.RedriveStarted {
			for i, call := range tr.rec.Calls {
				a := v.Approvals[i]
				if a == nil || tr.rec.Results[i] != nil {
					continue
				}
				claim := func() (*schemas.ExecutionClaim, error) {
					if !tr.rec.Legacy() {
						// Its claim is in the batch record (version 2).
						if c := tr.rec.ClaimOf(i); c != nil {
							return &schemas.ExecutionClaim{CallID: call.CallID, Worker: c.Worker, ClaimedAt: c.ClaimedAt}, nil
						}
						return nil, store.ErrNotFound
					}
					if claims.KV == nil {
						return nil, store.ErrNotFound
					}
					c, _, err := claims.Get(ctx, call.CallID)
					return c, err
				}
				sc, err := shadowCall(ctx, o, claim, gst, tr.rec.Context, call, a)
				if err != nil {
					return err
				}
				s.Calls = append(s.Calls, sc)
			}
		}
		tr.Shadow = s
	}
	return nil
}

// shadowCall is what the redriver would do with call, whose approval a is
// decided: redriver.PlanCall and, for a call a standing grant approved,
// redriver.RecheckGrant against the grants of gst at o.Now (a grant
// revoked, expired, gone or no longer offered: not run, GRANT_*); then,
// for a call it would run (or one the policy or the grant no longer
// allows, which the redriver reports by its claim if it has one), the
// call's execution claim (claimOf: in the batch record, or for a version 1
// batch in tollgate_claims; store.ErrNotFound when it has none).
func shadowCall(ctx context.Context, o Options, claimOf func() (*schemas.ExecutionClaim, error), gst *store.Store, tc *schemas.TurnContext, call schemas.ToolCall, a *schemas.ApprovalRecord) (ShadowCall, error) {
	sc := ShadowCall{CallID: call.CallID, Tool: call.Tool, ApprovalID: a.ApprovalID}
	// The shadow has no tool catalog: it judges without the tools' hints,
	// which can only make the redriver stricter than it shows.
	p := redriver.PlanCall(o.Policy, tc, call, tools.Hints{}, a)
	p, err := redriver.RecheckGrant(ctx, gst, o.Keys, o.Policy, tc, call, a, p, o.Now())
	if err != nil {
		return sc, fmt.Errorf("replay: grant of %s: %w", call.CallID, err)
	}
	if p.Run || p.Code == schemas.CodePolicyChanged || redriver.IsGrantCode(p.Code) {
		c, err := claimOf()
		switch {
		case errors.Is(err, store.ErrNotFound):
			// no claim: p stands
		case schemas.Permanent(err):
			sc.Would, sc.Code, sc.Reason = WouldNotRunAgain, schemas.CodeOf(err), "its execution claim does not decode: "+err.Error()
			return sc, nil
		case err != nil:
			return sc, fmt.Errorf("replay: claim of %s: %w", call.CallID, err)
		case c.Result != nil:
			sc.Would, sc.Status, sc.Code = WouldNotRunAgain, c.Result.Status, c.Result.Code
			sc.Reason = fmt.Sprintf("claimed by %s at %s; its result is recorded", c.Worker, c.ClaimedAt.Format(time.RFC3339))
			return sc, nil
		default:
			sc.Would = WouldNotRunAgain
			sc.Reason = fmt.Sprintf("claimed by %s at %s without a result: it runs there, or may have run (EXECUTION_UNCERTAIN after the claim lease)", c.Worker, c.ClaimedAt.Format(time.RFC3339))
			return sc, nil
		}
	}
	if p.Run {
		sc.Would = WouldRun
		return sc, nil
	}
	sc.Would, sc.Status, sc.Code, sc.Reason = WouldNotRun, p.Status, p.Code, p.Reason
	return sc, nil
}
