package web

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// CodeGrantNotFound: the grant a revocation names does not exist, or is
// not one the person may see (schemas.CodeGrantNotFound).
const CodeGrantNotFound = schemas.CodeGrantNotFound

// maxReasonBytes bounds a revocation's reason.
const maxReasonBytes = 500

// grantRow is one standing grant as the Grants page shows it.
type grantRow struct {
	ID, Option, Tool, Summary, Scope string
	Effect                           schemas.ApprovalStatus
	State                            string // live, expired or revoked
	Requester, Transport             string
	Principal                        string // who made it
	Mine                             bool   // the signed-in person made it
	CreatedAt, ExpiresAt             time.Time
	Uses                             uint64
	Revoked                          *schemas.GrantRevocation
	CSRF                             string
}

// Live reports whether the grant still decides calls (as far as its
// record says: the policy is checked again at use).
func (g *grantRow) Live() bool { return g.State == "live" }

// grantState is "live", "expired" or "revoked".
func grantState(g *schemas.Grant, now time.Time) string {
	switch schemas.CodeOf(g.Ended(now)) {
	case schemas.CodeGrantRevoked:
		return "revoked"
	case schemas.CodeGrantExpired:
		return "expired"
	}
	return "live"
}

// scopeText says what g's scope covers, in a few words.
func scopeText(sc schemas.GrantScope) string {
	s := "any session of the requester"
	if sc.Kind == schemas.GrantScopeSession {
		s = "session " + sc.SessionID
	}
	if sc.PathPrefix != "" {
		s += "; " + sc.PathField + " under " + sc.PathPrefix
	}
	if len(sc.Values) > 0 {
		s += fmt.Sprintf("; %s in %q", sc.ValueField, sc.Values)
	}
	return s
}

// mayRevoke reports, with nil, whether the person of sess may see and
// revoke grant g. g must be authentic (its MAC and its TurnContext's seal
// verify: a record written straight into KV decides nothing and is not
// shown). Then either the person made it (its principal), or the
// approver's decider rule (policy.Policy.MayDecideApproval, under the current policy,
// from the inbox's personal channel) lets them decide g's tool on the
// turn g was made on: whoever could have made the grant may end it.
// Revoking only narrows what runs, so this never widens authority.
func (s *Server) mayRevoke(g *schemas.Grant, sess *session) error {
	if !sess.SignedIn() {
		return schemas.Errorf(schemas.CodeDeciderNotAuthorized, "not signed in")
	}
	return s.cfg.Policy.MayRevokeGrant(g, Transport, sess.decider(), sess.channel(), s.cfg.Keys)
}

// grantsPage lists the grants the signed-in person may revoke (mayRevoke):
// live ones first, then those that ended; newest first within each. Each
// row says what the grant covers, for how long, how many approvals it
// decided, and offers Revoke while it is live.
func (s *Server) grantsPage(w http.ResponseWriter, r *http.Request) {
	sess := s.requireSignIn(w, r)
	if sess == nil {
		return
	}
	all, err := grants.List(r.Context(), s.store, func(key string, err error) {
		s.cfg.Logger.Warn("web: skipping a grant record", "key", key, "err", err)
	})
	if err != nil {
		s.message(w, r, http.StatusServiceUnavailable, "Unavailable", string(CodeUnavailable), "The grants cannot be read: try again.")
		return
	}
	uses, err := grants.UseCounts(r.Context(), s.cfg.JS)
	if err != nil {
		s.cfg.Logger.Warn("web: grant use counts", "err", err) // the page works without them
	}
	now := s.cfg.Now()
	var rows []*grantRow
	for _, g := range all {
		if s.mayRevoke(g, sess) != nil {
			continue
		}
		rows = append(rows, &grantRow{
			ID: g.GrantID, Option: g.Option, Tool: g.Tool, Summary: g.Summary, Scope: scopeText(g.Scope), Effect: g.Effect,
			State: grantState(g, now), Requester: g.Context.Requester.Principal, Transport: g.Context.Transport,
			Principal: g.Principal, Mine: g.Principal == sess.Principal(),
			CreatedAt: g.CreatedAt, ExpiresAt: g.ExpiresAt, Uses: uses[g.GrantID], Revoked: g.Revoked, CSRF: sess.csrf,
		})
	}
	slices.SortStableFunc(rows, func(a, b *grantRow) int {
		if a.Live() != b.Live() {
			if a.Live() {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.CreatedAt.UnixNano(), a.CreatedAt.UnixNano())
	})
	s.render(w, r, http.StatusOK, "grants", page{Title: "Grants", Session: sess, Grants: rows})
}

// revokeGrant revokes grant {id} for the signed-in person by a revocation
// request the approver carries out (requestRevocation; the approver marks
// the record by compare-and-set and publishes grant.revoked), recording
// web:<subject> as who revoked it; a rejection by the approver is answered
// with its code (as a decision's is). Refused before any request, with a
// code and without touching the grant: no live session (401 SIGNED_OUT),
// a CSRF token that is not the session's (403 CSRF_INVALID), the
// principal over its rate (429 RATE_LIMITED), an unknown grant (404
// GRANT_NOT_FOUND), a grant the person may not revoke (403
// DECIDER_NOT_AUTHORIZED) and a reason over 500 bytes (413). Revoking a
// grant that already ended changes nothing. The answer is a redirect to
// the Grants page.
func (s *Server) revokeGrant(w http.ResponseWriter, r *http.Request) {
	sess := s.formSession(w, r, "revoke", "requests")
	if sess == nil {
		return
	}
	id := r.PathValue("id")
	var g *schemas.Grant
	err := store.ErrNotFound
	if schemas.IsGrantID(id) { // never an index key (gi-...)
		g, _, err = s.store.Grants.Get(r.Context(), id)
	}
	switch {
	case errors.Is(err, store.ErrNotFound) || schemas.CodeOf(err) != "":
		s.refuse(w, r, nil, http.StatusNotFound, CodeGrantNotFound, "There is no such grant.")
		return
	case err != nil:
		s.refuse(w, r, nil, http.StatusServiceUnavailable, CodeUnavailable, "The grant cannot be read: try again.")
		return
	}
	if s.mayRevoke(g, sess) != nil {
		s.refuse(w, r, nil, http.StatusForbidden, schemas.CodeDeciderNotAuthorized, "You may not revoke this grant.")
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if len(reason) > maxReasonBytes {
		s.refuse(w, r, nil, http.StatusRequestEntityTooLarge, schemas.CodePayloadTooLarge, fmt.Sprintf("The reason is over %d bytes.", maxReasonBytes))
		return
	}
	d := &schemas.Decision{
		DecisionID: decisionID(sess.Principal(), id, schemas.OptionRevoke, ""), ApprovalID: id, Transport: Transport,
		Decider: sess.decider(), Channel: sess.channel(), Option: schemas.OptionRevoke,
		Note: cmp.Or(reason, "revoked in the web inbox"), SentAt: s.cfg.Now().UTC(),
	}
	rej, err := s.requestRevocation(r.Context(), d)
	switch {
	case err != nil:
		s.cfg.Logger.Error("web: revoke", "grant", id, "err", err)
		s.refuse(w, r, nil, http.StatusServiceUnavailable, CodeUnavailable, "The grant could not be revoked: try again.")
		return
	case rej != nil:
		s.refuse(w, r, nil, httpserve.RejectionStatus(rej.Code), rej.Code, rej.Reason)
		return
	}
	s.cfg.Logger.Info("web: grant revoked", "grant", id, "by", sess.Principal())
	http.Redirect(w, r, "/grants#"+id, http.StatusSeeOther)
}

// requestRevocation publishes d, a revocation request for grant
// d.ApprovalID, for the approver to carry out (approver.RevokeGrant: the
// approver, not the inbox, writes the grants bucket, so the inbox's NATS
// user needs no write access to it), and waits, at most DecisionWait, until
// the grant reads revoked (nil, nil), the approver rejected the request
// (the rejection), or the wait is over (an error).
func (s *Server) requestRevocation(ctx context.Context, d *schemas.Decision) (*schemas.DecisionRejected, error) {
	answers, stop, err := s.publishDecision(ctx, d,
		topology.EventSubject(topology.SubjectDecisionRejected, d.ApprovalID),
		topology.GrantEventSubject(schemas.GrantRevoked, d.ApprovalID))
	if err != nil {
		return nil, err
	}
	defer stop()
	wait, cancel := context.WithTimeout(ctx, s.cfg.DecisionWait)
	defer cancel()
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-wait.Done():
			return nil, fmt.Errorf("revocation of %s: no answer from the approver within %v", d.ApprovalID, s.cfg.DecisionWait)
		case <-poll.C:
			// A grant revoked before (its event is not published again)
			// or a duplicate request (answered by nobody): the record tells.
			if g, _, err := s.store.Grants.Get(ctx, d.ApprovalID); err == nil && g.Revoked != nil {
				return nil, nil
			}
		case m := <-answers:
			if route, rec, _ := topology.Read(m.Subject, m.Data, topology.RouteDecisionRejected); route == topology.RouteDecisionRejected {
				if rej, ok := rec.(*schemas.DecisionRejected); ok && rej.DecisionID == d.DecisionID {
					return rej, nil
				}
				continue
			}
			return nil, nil // the grant's revoked event
		}
	}
}
