// Package grants keeps standing grants (docs/protocol.md, "Grants"): the
// approver makes one when a decider chooses a grant option (Make), the
// executor looks for one that decides a call before it asks anyone (Find),
// the redriver checks again that the grant still stands before a call it
// approved runs (Recheck), and an operator lists and revokes them
// (`tollgate grants`, Revoke).
//
// A grant decides a call only if all of these hold, checked by Usable:
//
//   - it is authentic: its MAC and its TurnContext's seal verify with the
//     key ring (a record written straight into KV decides nothing:
//     GRANT_INVALID);
//   - it has not ended: not revoked (GRANT_REVOKED), not expired
//     (GRANT_EXPIRED);
//   - the current policy still offers its option for its tool with the
//     same scope, and still lets its principal decide the tool on its
//     turn (GRANT_REVOKED, the reason saying the policy changed; a
//     shortened "for" shortens it);
//   - it covers the call (Covers): the same tool; the same requester,
//     transport and trust boundary as the turn it was made on; a turn whose
//     audience is no wider and whose channel that audience admits
//     (schemas.Audience.Admits); the same session for a session grant;
//     and every argument pattern of its scope matches.
//
// Lookup cost: only a call that needs approval looks, and it reads one
// index record per (tool, requester) (schemas.GrantIndexKey) and then each
// grant it lists (a handful): never a listing of keys. A call whose
// requester has no grant for the tool costs one KV get.
package grants

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Covers reports, with nil, whether grant g covers the call of tool with
// arguments args on the turn whose (verified) context is tc; otherwise a
// GRANT_INVALID error saying why not. It is pure.
func Covers(g *schemas.Grant, tc *schemas.TurnContext, tool, args string) error {
	gc := g.Context
	no := func(format string, a ...any) error {
		return schemas.Errorf(schemas.CodeGrantInvalid, "grant %s does not cover this call: %s", g.GrantID, fmt.Sprintf(format, a...))
	}
	switch {
	case gc == nil || tc == nil:
		return no("no TurnContext")
	case g.Tool != tool:
		return no("it is for tool %s, not %s", g.Tool, tool)
	case tc.Requester.Principal != gc.Requester.Principal || tc.Requester.SenderID != gc.Requester.SenderID:
		return no("it was made on %s's turn, this is %s's", gc.Requester.Principal, tc.Requester.Principal)
	case tc.Requester.Kind != gc.Requester.Kind || tc.Requester.Verified != gc.Requester.Verified:
		return no("the requester's kind or verification differs from the turn it was made on")
	case tc.Transport != gc.Transport:
		return no("it was made on transport %s, this turn is on %s", gc.Transport, tc.Transport)
	case tc.TrustBoundary != gc.TrustBoundary:
		return no("it was made in trust boundary %s, this turn is in %s", gc.TrustBoundary, tc.TrustBoundary)
	case tc.Audience.Wider(gc.Audience) || !gc.Audience.Admits(tc.Channel.Kind):
		return no("it was made for a %s audience, this turn is %s in a %s channel", gc.Audience, tc.Audience, tc.Channel.Kind)
	case g.Scope.Kind == schemas.GrantScopeSession && (tc.SessionID != g.Scope.SessionID || gc.SessionID != g.Scope.SessionID):
		return no("it is for another session")
	case g.Scope.Kind != schemas.GrantScopeSession && g.Scope.Kind != schemas.GrantScopeRequester:
		return no("unknown scope %q", g.Scope.Kind)
	}
	if g.Scope.PathField != "" {
		v, ok := policy.StringArg(args, g.Scope.PathField)
		if !ok || !policy.PathUnder(v, g.Scope.PathPrefix) {
			return no("%s is not a path under %s", g.Scope.PathField, g.Scope.PathPrefix)
		}
	}
	if g.Scope.ValueField != "" {
		v, ok := policy.StringArg(args, g.Scope.ValueField)
		if !ok || !slices.Contains(g.Scope.Values, v) {
			return no("%s is not one of %q", g.Scope.ValueField, g.Scope.Values)
		}
	}
	return nil
}

// Usable reports, with nil, whether g may decide the call of tool with
// args on the turn tc at now, under pol and keys: authentic, not ended,
// still offered by the policy, and covering the call (see the package
// doc). The error carries GRANT_INVALID, GRANT_REVOKED or GRANT_EXPIRED.
func Usable(g *schemas.Grant, keys *seal.KeyRing, pol *policy.Policy, tc *schemas.TurnContext, tool, args string, now time.Time) error {
	if err := keys.VerifyGrant(g); err != nil {
		return err
	}
	if err := g.Ended(now); err != nil {
		return err
	}
	until, err := pol.StillGrants(g)
	if err != nil {
		return err
	}
	if !now.Before(until) {
		return schemas.Errorf(schemas.CodeGrantExpired, "grant %s expired at %s (policy %s shortened it)", g.GrantID, until.UTC().Format(time.RFC3339), pol.Version())
	}
	return Covers(g, tc, tool, args)
}

// Make builds the grant that decision info d, with grant option
// d.Option, makes on the approval rec, under pol, sealed with keys. It
// fails with OPTION_NOT_OFFERED when pol offers no such option for rec's
// call now. The grant's id, creation and expiry derive from d only, so
// building it again for a redelivered decision gives the same record.
func Make(rec *schemas.ApprovalRecord, d *schemas.DecisionInfo, pol *policy.Policy, keys *seal.KeyRing) (*schemas.Grant, error) {
	o, ok := pol.GrantOffer(rec.Tool, d.Option, rec.Context, rec.Args)
	if !ok {
		return nil, schemas.Errorf(schemas.CodeOptionNotOffered, "policy %s offers no grant option %q for this call of %s", pol.Version(), d.Option, rec.Tool)
	}
	g := &schemas.Grant{
		GrantID: schemas.GrantID(rec.ApprovalID, d.DecisionID), Option: o.Option, Effect: o.Effect,
		Tool: rec.Tool, Scope: o.Scope, Summary: o.Summary,
		Principal: d.Principal, Assurance: max(d.Assurance, schemas.AssuranceVerified), Context: rec.Context,
		ApprovalID: rec.ApprovalID, DecisionID: d.DecisionID, PolicyVersion: pol.Version(),
		CreatedAt: d.DecidedAt.UTC(), ExpiresAt: d.DecidedAt.UTC().Add(o.For),
	}
	if err := keys.SealGrant(g); err != nil {
		return nil, err
	}
	return g, nil
}

// Save stores g (KV create: a second Save of the same grant is a no-op),
// adds it to its (tool, requester) index, and publishes its created event.
// It is idempotent, so a redelivered decision can call it again; created
// says whether this call created the record (for counting grants once).
func Save(ctx context.Context, js jetstream.JetStream, st *store.Store, g *schemas.Grant, now time.Time) (created bool, err error) {
	_, err = st.Grants.Create(ctx, g.GrantID, g)
	switch {
	case err == nil:
		created = true
	case !errors.Is(err, store.ErrExists):
		return false, err
	}
	if err := index(ctx, st, g, now); err != nil {
		return created, err
	}
	ev := &schemas.GrantEvent{Kind: schemas.GrantCreated, GrantID: g.GrantID, Tool: g.Tool, Grant: g,
		ApprovalID: g.ApprovalID, TurnID: g.Context.TurnID, Status: g.Effect, At: g.CreatedAt}
	return created, Publish(ctx, js, ev)
}

// Reindex adds g to its (tool, requester) index record if it is not
// listed there (create or compare-and-set, as Save does): for a rebuild
// (pipeline/replay) of a grant whose index lost it.
func Reindex(ctx context.Context, st *store.Store, g *schemas.Grant, now time.Time) error {
	return index(ctx, st, g, now)
}

// index adds g to its index record, dropping grants that ended (when it
// can read them) and, if still full, the oldest.
func index(ctx context.Context, st *store.Store, g *schemas.Grant, now time.Time) error {
	key := schemas.GrantIndexKey(g.Tool, g.Context.Requester.Principal)
	for {
		x, rev, err := st.GrantIndexes.Get(ctx, key)
		switch {
		case errors.Is(err, store.ErrNotFound):
			x = &schemas.GrantIndex{Tool: g.Tool, Principal: g.Context.Requester.Principal}
		case schemas.Permanent(err):
			// An unreadable index is replaced: it only points at grants.
			x = &schemas.GrantIndex{Tool: g.Tool, Principal: g.Context.Requester.Principal}
		case err != nil:
			return err
		}
		if slices.Contains(x.Grants, g.GrantID) {
			return nil
		}
		if len(x.Grants) >= schemas.MaxGrantsPerIndex {
			x.Grants = prune(ctx, st, x.Grants, now)
		}
		if len(x.Grants) >= schemas.MaxGrantsPerIndex {
			x.Grants = x.Grants[len(x.Grants)-schemas.MaxGrantsPerIndex+1:]
		}
		x.Grants = append(slices.Clip(x.Grants), g.GrantID)
		x.UpdatedAt = now
		if rev == 0 {
			_, err = st.GrantIndexes.Create(ctx, key, x)
		} else {
			_, err = st.GrantIndexes.Update(ctx, key, x, rev)
		}
		switch {
		case errors.Is(err, store.ErrExists), errors.Is(err, store.ErrConflict):
			continue
		case err != nil:
			return err
		}
		return nil
	}
}

// prune keeps the ids of grants that have not ended (or cannot be read
// now: they are kept).
func prune(ctx context.Context, st *store.Store, ids []string, now time.Time) []string {
	var out []string
	for _, id := range ids {
		g, _, err := st.Grants.Get(ctx, id)
		if errors.Is(err, store.ErrNotFound) || schemas.Permanent(err) || err == nil && g.Ended(now) != nil {
			continue
		}
		out = append(out, id)
	}
	return out
}

// Find returns the grant that decides the call of tool with args on the
// turn tc at now, or nil: among the usable grants of the index of (tool,
// tc's requester), a deny grant wins over an approve grant (the stricter
// standing decision), and otherwise the one that expires last. Grants that
// are not usable are skipped and reported through skipped (may be nil),
// with the reason. The error is a transient one only.
func Find(ctx context.Context, st *store.Store, keys *seal.KeyRing, pol *policy.Policy, tc *schemas.TurnContext, tool, args string, now time.Time, skipped func(id string, why error)) (*schemas.Grant, error) {
	x, _, err := st.GrantIndexes.Get(ctx, schemas.GrantIndexKey(tool, tc.Requester.Principal))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, nil
	case schemas.Permanent(err):
		if skipped != nil {
			skipped(schemas.GrantIndexKey(tool, tc.Requester.Principal), err)
		}
		return nil, nil
	case err != nil:
		return nil, err
	}
	if x.Tool != tool || x.Principal != tc.Requester.Principal {
		return nil, nil
	}
	var best *schemas.Grant
	for _, id := range x.Grants {
		g, _, err := st.Grants.Get(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err == nil && g.GrantID != id {
			err = schemas.Errorf(schemas.CodeGrantInvalid, "record under %s names grant %s", id, g.GrantID)
		}
		if err == nil {
			err = Usable(g, keys, pol, tc, tool, args, now)
		}
		if schemas.Permanent(err) {
			if skipped != nil {
				skipped(id, err)
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		if best == nil || better(g, best) {
			best = g
		}
	}
	return best, nil
}

func better(g, than *schemas.Grant) bool {
	if (g.Effect == schemas.ApprovalDenied) != (than.Effect == schemas.ApprovalDenied) {
		return g.Effect == schemas.ApprovalDenied
	}
	return g.ExpiresAt.After(than.ExpiresAt)
}

// Decision is the decision info that records grant g deciding an approval
// at now: g's principal, option and assurance, and the grant itself.
func Decision(g *schemas.Grant, now time.Time) *schemas.DecisionInfo {
	return &schemas.DecisionInfo{
		DecisionID: g.GrantID, Principal: g.Principal, Option: g.Option, DecidedAt: now, Assurance: g.Assurance,
		Grant: &schemas.GrantUse{GrantID: g.GrantID, Scope: g.Scope, Summary: g.Summary},
	}
}

// Recheck is the redriver's check before a call that grant decided (a's
// Decision.Grant) runs: the grant is read again and must still be usable
// for the call at now. It returns nil or a coded error: GRANT_REVOKED
// (revoked, the policy no longer offers it, or its record is gone),
// GRANT_EXPIRED, GRANT_INVALID. The error without a code is transient.
func Recheck(ctx context.Context, st *store.Store, keys *seal.KeyRing, pol *policy.Policy, tc *schemas.TurnContext, call schemas.ToolCall, a *schemas.ApprovalRecord, now time.Time) error {
	use := a.Decision.Grant
	g, _, err := st.Grants.Get(ctx, use.GrantID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return schemas.Errorf(schemas.CodeGrantRevoked, "grant %s that approved this call is gone", use.GrantID)
	case schemas.Permanent(err):
		return schemas.Errorf(schemas.CodeGrantInvalid, "grant %s cannot be read: %v", use.GrantID, err)
	case err != nil:
		return err
	}
	if g.GrantID != use.GrantID || g.Principal != a.Decision.Principal || g.Option != a.Decision.Option || g.Effect != a.Status {
		return schemas.Errorf(schemas.CodeGrantInvalid, "approval %s names grant %s, whose record does not match its decision", a.ApprovalID, use.GrantID)
	}
	return Usable(g, keys, pol, tc, call.Tool, call.Args, now)
}

// Revoke marks grant id revoked by by (compare-and-set; revoking again
// changes nothing) and publishes its revoked event. It returns the grant
// as stored, and whether this call revoked it (false: it was revoked
// already; for counting revocations once). A grant is revoked even when
// it no longer verifies.
func Revoke(ctx context.Context, js jetstream.JetStream, st *store.Store, id, by, reason string, now time.Time) (*schemas.Grant, bool, error) {
	revoked := false
	g, _, err := st.Grants.Mutate(ctx, id, func(g *schemas.Grant) error {
		if g.Revoked != nil {
			revoked = false
			return store.ErrSkip
		}
		g.Revoked = &schemas.GrantRevocation{By: by, At: now.UTC(), Reason: reason}
		revoked = true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	ev := &schemas.GrantEvent{Kind: schemas.GrantRevoked, GrantID: g.GrantID, Tool: g.Tool, Grant: g,
		By: g.Revoked.By, Reason: g.Revoked.Reason, At: g.Revoked.At}
	return g, revoked, Publish(ctx, js, ev)
}

// Publish sends a grant event on its subject, deduplicated by message id
// (topology.GrantEventMsgID).
func Publish(ctx context.Context, js jetstream.JetStream, ev *schemas.GrantEvent) error {
	return bus.Publish(ctx, js, topology.GrantEventSubject(ev.Kind, ev.GrantID), topology.GrantEventMsgID(ev.Kind, ev.GrantID, ev.ApprovalID), ev)
}

// List reads every grant record of the bucket with one watcher (index
// records are skipped), oldest first. A record that does not decode is
// reported through skipped (may be nil) and left out. It reads the whole
// bucket: it is for listings (`tollgate grants list`, the web inbox's
// Grants page), never on a call's path.
func List(ctx context.Context, st *store.Store, skipped func(key string, err error)) ([]*schemas.Grant, error) {
	w, err := st.Grants.KV.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var out []*schemas.Grant
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				slices.SortStableFunc(out, func(a, b *schemas.Grant) int { return a.CreatedAt.Compare(b.CreatedAt) })
				return out, nil
			}
			if !schemas.IsGrantID(e.Key()) || strings.HasPrefix(e.Key(), "gi-") { // an index record
				continue
			}
			g, err := st.Grants.DecodeValue(e.Value())
			if err != nil {
				if skipped != nil {
					skipped(e.Key(), err)
				}
				continue
			}
			out = append(out, g)
		}
	}
}

// UseCounts returns how many approvals each grant decided: the number of
// its grant.used events still in the events stream, by grant id, read
// with one stream-info request (the stream's per-subject counts), not by
// reading the events.
func UseCounts(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	s, err := js.Stream(ctx, topology.StreamEvents)
	if err != nil {
		return nil, err
	}
	prefix := topology.GrantEventSubject(schemas.GrantUsed, "")
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		out[strings.TrimPrefix(subj, prefix)] += n
	}
	return out, nil
}
