package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Standing grants (tollgate_grants) are a projection of the grant events
// on TOLLGATE_EVENTS like the approvals and batches: each created and
// revoked event carries the grant record as stored (sealed, with its MAC;
// revoked with its revocation, which is outside the MAC). A replay covers
// the grants made on the turns of its Range, with every event of theirs,
// whenever stored: the record is the created event's, or the revoked
// event's when there is one. It is created where the key is missing, and
// moved to revoked (compare-and-set) where KV holds it unrevoked; a
// record that differs from the events in anything else (another grant
// under the id, another MAC) is a conflict and left alone, and a revoked
// one stays revoked. A grant that has not ended is put back in its (tool,
// requester) index (grants.Reindex), so that it decides calls again.

// streamGrants are the grant records the grant events prove, for the
// grants made on a turn of turns, in the order of their first event.
func streamGrants(ctx context.Context, js jetstream.JetStream, turns map[string]bool, h *History) ([]*schemas.Grant, error) {
	var order []*schemas.Grant
	byID := map[string]int{}
	filters := []string{
		topology.GrantEventSubject(schemas.GrantCreated, "*"),
		topology.GrantEventSubject(schemas.GrantRevoked, "*"),
	}
	err := scan(ctx, js, topology.StreamEvents, filters, startAt{}, func(m jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		ev, err := schemas.Decode[schemas.GrantEvent](m.Data())
		switch {
		case err != nil:
			h.skip(m.Subject(), meta.Sequence.Stream, err)
			return true, nil
		case ev.Grant == nil || ev.Grant.Context == nil || ev.Grant.GrantID != ev.GrantID ||
			m.Subject() != topology.GrantEventSubject(ev.Kind, ev.GrantID) || (ev.Kind == schemas.GrantRevoked) != (ev.Grant.Revoked != nil):
			h.skip(m.Subject(), meta.Sequence.Stream, fmt.Errorf("a %s grant event without the record it announces", ev.Kind))
			return true, nil
		case !turns[ev.Grant.Context.TurnID]:
			return true, nil
		}
		i, seen := byID[ev.GrantID]
		switch {
		case !seen:
			byID[ev.GrantID] = len(order)
			order = append(order, ev.Grant)
		case ev.Kind == schemas.GrantRevoked && order[i].Revoked == nil:
			order[i] = ev.Grant
		}
		return true, nil
	})
	return order, err
}

// grants converges tollgate_grants on the grants of h's turns (see above)
// and reports each in Report.Grants.
func (a *applier) grants(ctx context.Context, h *History) error {
	turns := map[string]bool{}
	for _, t := range h.Turns {
		turns[t.TurnID] = true
	}
	want, err := streamGrants(ctx, a.js, turns, h)
	if err != nil {
		return err
	}
	st := &store.Store{
		Grants:       store.Bucket[schemas.Grant, *schemas.Grant]{KV: a.b.grants},
		GrantIndexes: store.Bucket[schemas.GrantIndex, *schemas.GrantIndex]{KV: a.b.grants},
	}
	for _, g := range want {
		c, rec, err := converge(ctx, a, a.b.grants, g.GrantID, g, judgeGrant)
		if err != nil {
			return err
		}
		c.Streams = grantStage(g)
		a.count(c)
		a.rep.Grants = append(a.rep.Grants, c)
		if rec == nil || c.Action == Conflict || rec.Ended(a.o.Now()) != nil {
			continue
		}
		ic, err := a.reindex(ctx, st, rec)
		if err != nil {
			return err
		}
		if ic.Action != Unchanged {
			a.count(ic)
			a.rep.Grants = append(a.rep.Grants, ic)
		}
	}
	return nil
}

// reindex reports whether g's (tool, requester) index lists it and, on
// Rebuild, adds it when it does not.
func (a *applier) reindex(ctx context.Context, st *store.Store, g *schemas.Grant) (Change, error) {
	key := schemas.GrantIndexKey(g.Tool, g.Context.Requester.Principal)
	c := Change{Key: key, Action: Unchanged, Streams: "lists " + g.GrantID}
	var x *schemas.GrantIndex
	err := store.ErrNotFound
	if a.b.grants != nil {
		x, _, err = st.GrantIndexes.Get(ctx, key)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		c.Action, c.KV = Create, "absent"
	case schemas.Permanent(err):
		c.Action, c.KV = Update, "undecodable"
	case err != nil:
		return c, fmt.Errorf("replay: read %s/%s: %w", topology.BucketGrants, key, err)
	case slices.Contains(x.Grants, g.GrantID):
		return c, nil
	default:
		c.Action, c.KV = Update, fmt.Sprintf("%d grants, not %s", len(x.Grants), g.GrantID)
	}
	if a.o.Rebuild {
		if err := grants.Reindex(ctx, st, g, a.o.Now()); err != nil {
			return c, fmt.Errorf("replay: index grant %s: %w", g.GrantID, err)
		}
	}
	return c, nil
}

func judgeGrant(raw []byte, want *schemas.Grant) judgement[*schemas.Grant] {
	have, err := schemas.Decode[schemas.Grant](raw)
	if err != nil {
		return judgement[*schemas.Grant]{action: Kept, kv: "undecodable", reason: fmt.Sprintf("left alone (it decides nothing): %v", err)}
	}
	j := judgement[*schemas.Grant]{action: Unchanged, kv: grantStage(have), next: have}
	hb, herr := schemas.GrantSealedBytes(have)
	wb, werr := schemas.GrantSealedBytes(want)
	switch {
	case herr != nil || werr != nil || !bytes.Equal(hb, wb) || !sameSeal(have.MAC, want.MAC):
		j.action, j.reason = Conflict, "KV's grant differs from the one its grant events carry"
	case have.Revoked == nil && want.Revoked != nil:
		next := *have
		next.Revoked = want.Revoked
		j.action, j.next = Update, &next
	case have.Revoked != nil && want.Revoked == nil:
		j.reason = "KV is further along than the streams (revoked)"
	}
	return j
}

func sameSeal(a, b *schemas.Seal) bool {
	return (a == nil) == (b == nil) && (a == nil || a.KeyID == b.KeyID && bytes.Equal(a.MAC, b.MAC))
}

// grantStage is a grant's stage for a Change: active or revoked.
func grantStage(g *schemas.Grant) string {
	if g.Revoked != nil {
		return "revoked"
	}
	return "active"
}
