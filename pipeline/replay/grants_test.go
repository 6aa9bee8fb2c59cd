package replay_test

import (
	"bytes"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/replay"
	"github.com/tollgate-dev/tollgate/schemas"
)

// grantChange is the report's verdict on key, failing if there is none.
func grantChange(t *testing.T, rep *replay.Report, key string) replay.Change {
	t.Helper()
	for _, c := range rep.Grants {
		if c.Key == key {
			return c
		}
	}
	t.Fatalf("%s not in the report's grants: %+v", key, rep.Grants)
	return replay.Change{}
}

// TestRebuildBringsBackStandingGrants: the grants bucket loses a grant,
// a revoked grant and the index that lists the live one; a report says so
// and writes nothing; a rebuild brings each back from the grant events
// with the same bytes (the revoked one revoked) and the live one in its
// index again, so it decides the next call without a prompt; a second
// rebuild changes nothing.
func TestRebuildBringsBackStandingGrants(t *testing.T) {
	granted := &pt.Counter{ToolName: "granted"}
	h := start(t, nil, nil, granted)
	makeGrant := func(sender string) string {
		t.Helper()
		turn := h.Send(h.Inbound("s-"+sender, sender, pt.Call("granted", `{"n":1}`)))
		h.WaitPending(schemas.ApprovalID(turn, 0))
		d := h.Decide(schemas.ApprovalID(turn, 0), "approve-day", sender)
		gid := schemas.GrantID(schemas.ApprovalID(turn, 0), d.DecisionID)
		jstest.Eventually(t, pt.Wait, "grant "+gid, func() bool {
			ctx, cancel := h.Ctx()
			defer cancel()
			_, _, err := h.Store.Grants.Get(ctx, gid)
			return err == nil
		})
		h.WaitTerminal(turn)
		return gid
	}
	live, revoked := makeGrant("alice"), makeGrant("bob")
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := grants.Revoke(ctx, h.JS, h.Store, revoked, "cli:operator", "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	kv := h.Store.Grants.KV
	index := schemas.GrantIndexKey("granted", "cli:alice")
	before := map[string][]byte{live: raw(t, h, kv, live), revoked: raw(t, h, kv, revoked)}
	if r, err := schemas.Decode[schemas.Grant](before[revoked]); err != nil || r.Revoked == nil {
		t.Fatalf("the revoked grant as stored: %+v, %v", r, err)
	}
	h.Stop()
	for _, key := range []string{live, revoked, index} {
		if err := kv.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}

	rep := run(t, h, replay.Options{})
	for _, key := range []string{live, revoked, index} {
		if c := grantChange(t, rep, key); c.Action != replay.Create {
			t.Fatalf("report: %s: %+v, want create", key, c)
		}
		if raw(t, h, kv, key) != nil {
			t.Fatalf("a report wrote %s", key)
		}
	}

	rep = run(t, h, replay.Options{Rebuild: true})
	if c := grantChange(t, rep, revoked); c.Action != replay.Create || c.Streams != "revoked" {
		t.Fatalf("rebuild: the revoked grant: %+v", c)
	}
	for id, b := range before {
		if got := raw(t, h, kv, id); !bytes.Equal(got, b) {
			t.Fatalf("grant %s rebuilt as\n%x\nwant the record as stored\n%x", id, got, b)
		}
	}
	x, _, err := h.Store.GrantIndexes.Get(ctx, index)
	if err != nil || len(x.Grants) != 1 || x.Grants[0] != live {
		t.Fatalf("index %s after the rebuild: %+v, %v; want it to list %s", index, x, err, live)
	}
	if again := run(t, h, replay.Options{Rebuild: true}); again.Changes != 0 || again.Conflicts != 0 {
		t.Fatalf("a second rebuild: %d changes, %d conflicts: %+v", again.Changes, again.Conflicts, again.Grants)
	}

	// The rebuilt grant decides alice's next call; bob's revoked one does not.
	h = start(t, h, nil, granted)
	next := h.Send(h.Inbound("s-next", "alice", pt.Call("granted", `{"n":2}`)))
	a := h.WaitApproval(schemas.ApprovalID(next, 0), "decided by the grant", func(a *schemas.ApprovalRecord) bool { return a.Status != schemas.ApprovalPending })
	if a.Decision == nil || a.Decision.Grant == nil || a.Decision.Grant.GrantID != live {
		t.Fatalf("alice's next call: %s by %+v, want approved by grant %s", a.Status, a.Decision, live)
	}
	h.WaitPending(schemas.ApprovalID(h.Send(h.Inbound("s-next-bob", "bob", pt.Call("granted", `{"n":2}`))), 0))
}
