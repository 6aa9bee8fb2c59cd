package policy

import (
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// The decider rule on a stored record: whether a person may decide an
// approval or revoke a grant. Its one home is here, beside the policy's
// own MayDecide that it ends with, so that the approver (which applies
// decisions), the inbox (which shows only what a person may decide) and
// anything else that offers a decision apply the same rule without
// linking a stage.

// MayDecideApproval reports, with nil, whether the sender decider, as
// transport vouches for them and posting in channel (nil: not said), may
// decide the approval rec; otherwise a *schemas.Error saying why not. It is
// the decider part of the approver's Authorize (pipeline/approver), so a
// list of who may decide (the buttons an inbox shows) is computed by the
// same rule that accepts their decision. It consults only rec's persisted
// TurnContext, the policy and the keys, never anything else a decision
// claims:
//
//   - the TurnContext must be authentic (keys.Verify: TURN_CONTEXT_MISSING,
//     TURN_CONTEXT_INVALID, TURN_CONTEXT_TAMPERED, SEAL_KEY_UNKNOWN,
//     SCHEMA_VERSION_UNSUPPORTED) and be the authority of rec's turn
//     (TURN_CONTEXT_MISMATCH), or an edited record could name anyone as
//     requester;
//   - DECIDER_NOT_AUTHORIZED: the decider is not a person the transport
//     verified (an unverified id could be anyone's; bots, services and
//     API keys, which a transport sends as services, cannot answer a
//     prompt); or channel reaches more people than the turn's audience
//     (deciding there would show the call to them); or p.MayDecide
//     refuses the principal at the decider's assurance (among its reasons:
//     a requester that is not a person never decides its own turn).
func (p *Policy) MayDecideApproval(rec *schemas.ApprovalRecord, transport string, decider schemas.Sender, channel *schemas.Channel, keys *seal.KeyRing) error {
	if err := keys.Verify(rec.Context); err != nil {
		return schemas.Errorf(schemas.CodeOf(err), "approval %s has no authentic TurnContext to authorize against: %v", rec.ApprovalID, err)
	}
	if err := rec.Context.CheckFor(rec.TurnID); err != nil {
		return schemas.Errorf(schemas.CodeOf(err), "approval %s: %v", rec.ApprovalID, err)
	}
	principal := schemas.Principal(transport, decider.ID)
	if decider.Kind != schemas.SenderUser || !decider.Verified {
		return schemas.Errorf(schemas.CodeDeciderNotAuthorized, "%s is not a verified user (kind %q, verified %v): only a person decides", principal, decider.Kind, decider.Verified)
	}
	if channel != nil {
		if !rec.Context.Audience.Admits(channel.Kind) {
			return schemas.Errorf(schemas.CodeDeciderNotAuthorized, "decision posted in a %s channel for a %s turn", channel.Kind, rec.Context.Audience)
		}
	}
	if err := p.MayDecide(rec.Tool, rec.Context, principal, decider.Assurance()); err != nil {
		return schemas.Errorf(schemas.CodeDeciderNotAuthorized, "%v", err)
	}
	return nil
}

// MayRevokeGrant reports, with nil, whether decider, delivered by transport
// (in channel, if set), may revoke grant g: the grant must be authentic
// (its MAC and its sealed context verify), and the decider must be the
// verified person who made it, or someone MayDecideApproval lets decide
// g's tool on the turn g was made on. Otherwise it returns a coded error (the seal's
// code, or DECIDER_NOT_AUTHORIZED).
func (p *Policy) MayRevokeGrant(g *schemas.Grant, transport string, decider schemas.Sender, channel *schemas.Channel, keys *seal.KeyRing) error {
	if err := keys.VerifyGrant(g); err != nil {
		return err
	}
	if decider.Kind == schemas.SenderUser && decider.Verified && schemas.Principal(transport, decider.ID) == g.Principal {
		return nil
	}
	rec := &schemas.ApprovalRecord{ApprovalID: g.ApprovalID, TurnID: g.Context.TurnID, Tool: g.Tool, Context: g.Context}
	return p.MayDecideApproval(rec, transport, decider, channel, keys)
}
