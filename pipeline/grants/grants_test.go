package grants_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/grants"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// grantPolicy offers grant options on count (session, deny-session and a
// day for the requester), write_file (a folder) and vote (a quorum tool,
// whose rule does not allow grants to stand in for the quorum).
const grantPolicy = `{
  "version": "grants-v1",
  "default_approval": "required",
  "tools": {
    "echo": {"approval": "never"},
    "count": {"approval": "required", "grants": [
      {"option": "approve-session", "scope": "session", "for": "1h"},
      {"option": "deny-session", "scope": "session", "for": "1h"},
      {"option": "approve-day", "scope": "requester", "for": "24h"}
    ]},
    "write_file": {"approval": "required", "audiences": {"public": "deny"}, "grants": [
      {"option": "approve-folder", "scope": "requester", "for": "24h", "path_prefix": "path"}
    ]},
    "vote": {"approval": "required", "deciders": {"principals": ["cli:boss1", "cli:boss2"], "quorum": 2}, "grants": [
      {"option": "approve-session", "scope": "session"}
    ]}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// noGrantPolicy is grantPolicy's next version: count no longer offers
// grants.
var noGrantPolicy = strings.Replace(strings.Replace(grantPolicy, `"version": "grants-v1"`, `"version": "grants-v2"`, 1),
	`"count": {"approval": "required", "grants": [
      {"option": "approve-session", "scope": "session", "for": "1h"},
      {"option": "deny-session", "scope": "session", "for": "1h"},
      {"option": "approve-day", "scope": "requester", "for": "24h"}
    ]},`, `"count": {"approval": "required"},`, 1)

type fixture struct {
	*pipelinetest.H
	count, vote *pipelinetest.Counter
}

func start(t *testing.T, policy string, env *jstest.Env, stages ...string) *fixture {
	f := &fixture{count: &pipelinetest.Counter{}, vote: &pipelinetest.Counter{ToolName: "vote"}}
	o := pipelinetest.Options{Policy: policy, Tools: []tools.Tool{f.count, f.vote}, Env: env}
	if len(stages) > 0 {
		o.Stages = stages
	}
	f.H = pipelinetest.Start(t, o)
	return f
}

// send sends one call from sender in session, posted in a channel of kind,
// and returns the turn and its approval id.
func (f *fixture) send(session, sender string, kind schemas.ChannelKind, call schemas.ProposedCall) (turn, approval string) {
	f.T.Helper()
	m := f.Inbound(session, sender, call)
	m.Channel.Kind = kind
	turn = f.Send(m)
	return turn, schemas.ApprovalID(turn, 0)
}

// grant makes a grant: sender asks for call in session (a DM), and decides
// its approval with option. It waits for the grant record and returns it
// with the turn.
func (f *fixture) grant(session, sender string, call schemas.ProposedCall, option string) (string, *schemas.Grant) {
	f.T.Helper()
	turn, id := f.send(session, sender, schemas.ChannelDM, call)
	a := f.WaitPending(id)
	if !a.Offers(option) {
		f.T.Fatalf("approval %s does not offer %s: %v", id, option, a.Options)
	}
	if o, ok := a.Offer(option); !ok || o.Summary == "" {
		f.T.Fatalf("approval %s: no description of %s: %+v", id, option, a.Grants)
	}
	d := f.Decide(id, option, sender)
	return turn, f.WaitGrant(schemas.GrantID(id, d.DecisionID))
}

func (f *fixture) noGrant(id string) {
	f.T.Helper()
	ctx, cancel := f.Ctx()
	defer cancel()
	if _, _, err := f.Store.Grants.Get(ctx, id); !errors.Is(err, store.ErrNotFound) {
		f.T.Fatalf("grant %s: %v, want none", id, err)
	}
}

// prompted asserts approval id waits for a person: pending, decided by
// nobody (no grant covered its call).
func (f *fixture) prompted(id string) {
	f.T.Helper()
	a := f.WaitPending(id)
	if a.Decision != nil {
		f.T.Fatalf("approval %s: decision %+v, want none", id, a.Decision)
	}
}

func (f *fixture) grantEvents(kind schemas.GrantEventKind, grantID string) []*schemas.GrantEvent {
	return pipelinetest.DecodeAll[schemas.GrantEvent](f.T, f.Events(topology.GrantEventSubject(kind, grantID)))
}

func callCount(i int) schemas.ProposedCall {
	return pipelinetest.Call("count", `{"n":`+string(rune('0'+i))+`}`)
}

func writeFile(path string) schemas.ProposedCall {
	return pipelinetest.Call("write_file", `{"path":"`+path+`","content":"x"}`)
}

func TestSessionGrantApprovesTheNextCallWithoutAPrompt(t *testing.T) {
	f := start(t, grantPolicy, nil)
	turn1, g := f.grant("s-happy", "alice", callCount(1), "approve-session")
	f.WaitTerminal(turn1)
	if g.Effect != schemas.ApprovalApproved || g.Principal != "cli:alice" || g.Scope.Kind != schemas.GrantScopeSession ||
		g.Scope.SessionID != "s-happy" || g.Context == nil || g.PolicyVersion != "grants-v1" {
		t.Fatalf("grant %+v", g)
	}
	if got := f.grantEvents(schemas.GrantCreated, g.GrantID); len(got) != 1 || got[0].Grant == nil || got[0].Grant.GrantID != g.GrantID {
		t.Fatalf("created events %+v", got)
	}

	turn2, id2 := f.send("s-happy", "alice", schemas.ChannelDM, callCount(2))
	_, out := f.WaitTerminal(turn2)
	if out.State != schemas.TurnCompleted || out.Results[0].Status != schemas.ResultOK {
		t.Fatalf("outcome %+v", out)
	}
	if f.count.Runs(schemas.CallID(turn2, 0)) != 1 {
		t.Fatalf("the granted call ran %d times", f.count.Runs(schemas.CallID(turn2, 0)))
	}
	a := f.Approval(id2)
	if a.Status != schemas.ApprovalApproved || a.Decision == nil || a.Decision.Grant == nil || a.Decision.Grant.GrantID != g.GrantID ||
		a.Decision.Principal != "cli:alice" || a.Decision.Option != "approve-session" {
		t.Fatalf("approval %+v decision %+v", a, a.Decision)
	}
	for _, r := range f.Requested(turn2) {
		if r.Status == schemas.ApprovalPending {
			t.Fatalf("a prompt was announced for the granted call: %+v", r)
		}
	}
	dec := f.Decisions(turn2)
	if len(dec) != 1 || dec[0].Decision == nil || dec[0].Decision.Grant == nil || dec[0].Decision.Grant.GrantID != g.GrantID {
		t.Fatalf("decided events %+v", dec)
	}
	used := f.grantEvents(schemas.GrantUsed, g.GrantID)
	if len(used) != 1 || used[0].ApprovalID != id2 || used[0].Status != schemas.ApprovalApproved {
		t.Fatalf("used events %+v", used)
	}

	// Another session of the same requester is not covered.
	_, id3 := f.send("s-happy-other", "alice", schemas.ChannelDM, callCount(3))
	f.prompted(id3)
}

func TestDenyGrantDeniesLaterCalls(t *testing.T) {
	f := start(t, grantPolicy, nil)
	turn1, g := f.grant("s-deny", "alice", callCount(1), "deny-session")
	_, out1 := f.WaitTerminal(turn1)
	if g.Effect != schemas.ApprovalDenied || out1.Results[0].Status != schemas.ResultDenied {
		t.Fatalf("grant %+v, outcome %+v", g, out1)
	}
	turn2, id2 := f.send("s-deny", "alice", schemas.ChannelDM, callCount(2))
	_, out := f.WaitTerminal(turn2)
	if out.Results[0].Status != schemas.ResultDenied || out.Results[0].Code != schemas.CodeApprovalDenied {
		t.Fatalf("outcome %+v", out.Results[0])
	}
	if a := f.Approval(id2); a.Decision == nil || a.Decision.Grant == nil || a.Decision.Grant.GrantID != g.GrantID {
		t.Fatalf("approval decision %+v", a.Decision)
	}
	if f.count.Total() != 0 {
		t.Fatalf("count ran %d times", f.count.Total())
	}
}

// The adversarial rows that need no control over the redrive: each tries
// to get a call decided by a grant that must not cover it, and asserts
// the call was prompted for (or refused) and never ran.
func TestGrantsDoNotWiden(t *testing.T) {
	f := start(t, grantPolicy, nil)

	t.Run("a grant made in a DM used from a public channel", func(t *testing.T) {
		h := &fixture{H: f.For(t), count: f.count}
		turn1, g := h.grant("s-dm", "alice1", callCount(1), "approve-day")
		h.WaitTerminal(turn1)
		turn2, id2 := h.send("s-public", "alice1", schemas.ChannelPublic, callCount(2))
		h.prompted(id2)
		if n := h.count.Runs(schemas.CallID(turn2, 0)); n != 0 {
			t.Fatalf("ran %d times", n)
		}
		tc := h.Approval(id2).Context
		if err := grants.Covers(g, tc, "count", `{"n":2}`); schemas.CodeOf(err) != schemas.CodeGrantInvalid {
			t.Fatalf("Covers: %v", err)
		}
	})

	t.Run("a grant made by A used by requester B", func(t *testing.T) {
		h := &fixture{H: f.For(t), count: f.count}
		turn1, g := h.grant("s-ab", "alice2", callCount(1), "approve-day")
		h.WaitTerminal(turn1)
		turn2, id2 := h.send("s-ab-bob", "bob2", schemas.ChannelDM, callCount(2))
		h.prompted(id2)
		if n := h.count.Runs(schemas.CallID(turn2, 0)); n != 0 {
			t.Fatalf("ran %d times", n)
		}
		if err := grants.Covers(g, h.Approval(id2).Context, "count", `{"n":2}`); schemas.CodeOf(err) != schemas.CodeGrantInvalid {
			t.Fatalf("Covers: %v", err)
		}
	})

	t.Run("a grant on write_file in notes/ used outside it", func(t *testing.T) {
		h := &fixture{H: f.For(t), count: f.count}
		turn1, g := h.grant("s-notes", "alice3", writeFile("notes/a.txt"), "approve-folder")
		h.WaitTerminal(turn1)
		if g.Scope.PathPrefix != "notes/" || g.Scope.PathField != "path" {
			t.Fatalf("scope %+v", g.Scope)
		}
		// Inside: decided by the grant and written.
		turnIn, idIn := h.send("s-notes-2", "alice3", schemas.ChannelDM, writeFile("notes/b.txt"))
		if _, out := h.WaitTerminal(turnIn); out.Results[0].Status != schemas.ResultOK {
			t.Fatalf("in notes/: %+v", out.Results[0])
		}
		if a := h.Approval(idIn); a.Decision == nil || a.Decision.Grant == nil {
			t.Fatalf("in notes/: not decided by the grant: %+v", a.Decision)
		}
		for _, p := range []string{"../etc/passwd", "notes/../x.txt", "notes2/a.txt", "/notes/a.txt"} {
			turn, id := h.send("s-notes-"+p, "alice3", schemas.ChannelDM, writeFile(p))
			b := h.WaitBatch(turn, "awaiting or terminal", func(b *schemas.BatchRecord) bool {
				return b.State == schemas.BatchAwaiting || b.State.Terminal()
			})
			if a := h.Approval(id); a != nil && a.Decision != nil {
				t.Fatalf("%s: decided %+v", p, a.Decision)
			}
			if b.State == schemas.BatchAwaiting {
				h.prompted(id)
			}
			if err := grants.Covers(g, b.Context, "write_file", `{"path":"`+p+`"}`); schemas.CodeOf(err) != schemas.CodeGrantInvalid {
				t.Fatalf("%s: Covers: %v", p, err)
			}
		}
		for _, p := range []string{"x.txt", "notes2/a.txt", "../etc/passwd"} {
			if _, ok := h.File(p); ok {
				t.Fatalf("%s was written", p)
			}
		}
	})

	t.Run("a grant made by someone who may not decide the tool", func(t *testing.T) {
		h := &fixture{H: f.For(t), count: f.count}
		turn, id := h.send("s-mallory", "alice4", schemas.ChannelDM, callCount(1))
		h.WaitPending(id)
		d := h.Decide(id, "approve-session", "mallory")
		if rej := h.WaitRejection(d); rej.Code != schemas.CodeDeciderNotAuthorized {
			t.Fatalf("rejection %+v", rej)
		}
		h.noGrant(schemas.GrantID(id, d.DecisionID))
		h.prompted(id)
		if n := h.count.Runs(schemas.CallID(turn, 0)); n != 0 {
			t.Fatalf("ran %d times", n)
		}
	})

	t.Run("a grant on a quorum tool", func(t *testing.T) {
		h := &fixture{H: f.For(t), count: f.count}
		turn, id := h.send("s-quorum", "alice5", schemas.ChannelDM, pipelinetest.Call("vote", `{}`))
		a := h.WaitPending(id)
		if slices.Contains(a.Options, "approve-session") || len(a.Grants) != 0 {
			t.Fatalf("quorum tool offers a grant: %v %+v", a.Options, a.Grants)
		}
		d := h.Decide(id, "approve-session", "boss1")
		if rej := h.WaitRejection(d); rej.Code != schemas.CodeOptionNotOffered {
			t.Fatalf("rejection %+v", rej)
		}
		h.noGrant(schemas.GrantID(id, d.DecisionID))
		h.prompted(id)
		if n := f.vote.Runs(schemas.CallID(turn, 0)); n != 0 {
			t.Fatalf("ran %d times", n)
		}
	})

	t.Run("a forged grant record written into KV", func(t *testing.T) {
		h := &fixture{H: f.For(t), count: f.count}
		// A real turn of alice6's gives the forger an authentic, sealed
		// TurnContext to embed; what it cannot make is the grant's MAC.
		turn0, id0 := h.send("s-forged", "alice6", schemas.ChannelDM, callCount(0))
		a0 := h.WaitPending(id0)
		ctx, cancel := h.Ctx()
		defer cancel()
		now := time.Now().UTC()
		forged := []*schemas.Grant{
			{GrantID: "g-forged-nomac", Option: "approve-day", Effect: schemas.ApprovalApproved, Tool: "count",
				Scope: schemas.GrantScope{Kind: schemas.GrantScopeRequester}, Principal: "cli:alice6", Context: a0.Context,
				ApprovalID: id0, DecisionID: "d-forged", PolicyVersion: "grants-v1", CreatedAt: now, ExpiresAt: now.Add(time.Hour)},
		}
		bad := *forged[0]
		bad.GrantID = "g-forged-badmac"
		bad.MAC = &schemas.Seal{KeyID: "k1", MAC: make([]byte, 32)}
		forged = append(forged, &bad)
		// One sealed honestly, then widened after sealing.
		widened := *forged[0]
		widened.GrantID = "g-forged-widened"
		if err := h.Keys.SealGrant(&widened); err != nil {
			t.Fatal(err)
		}
		widened.Scope.Kind, widened.Scope.SessionID = schemas.GrantScopeSession, "s-forged"
		widened.Option = "approve-session"
		forged = append(forged, &widened)
		ids := []string{}
		for _, g := range forged {
			if _, err := h.Store.Grants.Create(ctx, g.GrantID, g); err != nil {
				t.Fatal(err)
			}
			if err := h.Keys.VerifyGrant(g); schemas.CodeOf(err) != schemas.CodeGrantInvalid {
				t.Fatalf("%s verifies: %v", g.GrantID, err)
			}
			ids = append(ids, g.GrantID)
		}
		if _, err := h.Store.GrantIndexes.Create(ctx, schemas.GrantIndexKey("count", "cli:alice6"),
			&schemas.GrantIndex{Tool: "count", Principal: "cli:alice6", Grants: ids, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		h.Decide(id0, "approve", "alice6")
		h.WaitTerminal(turn0)
		turn, id := h.send("s-forged", "alice6", schemas.ChannelDM, callCount(1))
		h.prompted(id)
		if n := h.count.Runs(schemas.CallID(turn, 0)); n != 0 {
			t.Fatalf("ran %d times", n)
		}
		for _, g := range forged {
			if u := h.grantEvents(schemas.GrantUsed, g.GrantID); len(u) != 0 {
				t.Fatalf("forged grant %s used: %+v", g.GrantID, u)
			}
		}
	})
}

// redriveFixture runs the stages that decide but not the redriver, so a
// test controls when a grant-approved call is redriven.
func redriveFixture(t *testing.T) *fixture {
	return start(t, grantPolicy, nil, pipelinetest.Ingest, pipelinetest.Executor, pipelinetest.Approver)
}

// grantedAwaiting makes a requester grant on count for sender and sends a
// call in a new session that it decides; it returns the grant and the
// turn, awaiting its redrive.
func (f *fixture) grantedAwaiting(sender string) (*schemas.Grant, string) {
	f.T.Helper()
	_, g := f.grant("s-"+sender+"-1", sender, callCount(1), "approve-day")
	turn, id := f.send("s-"+sender+"-2", sender, schemas.ChannelDM, callCount(2))
	f.WaitState(turn, schemas.BatchAwaiting)
	if a := f.Approval(id); a.Decision == nil || a.Decision.Grant == nil || a.Decision.Grant.GrantID != g.GrantID {
		f.T.Fatalf("approval %s not decided by grant %s: %+v", id, g.GrantID, a.Decision)
	}
	return g, turn
}

// redriveFails redrives turn and asserts its call failed with code and did
// not run.
func (f *fixture) redriveFails(turn string, code schemas.Code) *schemas.ToolResult {
	f.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	if err := f.Redriver.Redrive(ctx, turn, "test"); err != nil {
		f.T.Fatalf("redrive: %v", err)
	}
	_, out := f.WaitTerminal(turn)
	r := out.Results[0]
	if r.Status != schemas.ResultFailed || r.Code != code {
		f.T.Fatalf("result %+v, want failed %s", r, code)
	}
	if n := f.count.Runs(schemas.CallID(turn, 0)); n != 0 {
		f.T.Fatalf("the call ran %d times", n)
	}
	return &r
}

func TestRevokedGrantFailsAtRedrive(t *testing.T) {
	f := redriveFixture(t)
	g, turn := f.grantedAwaiting("alice")
	ctx, cancel := f.Ctx()
	defer cancel()
	rev, first, err := grants.Revoke(ctx, f.JS, f.Store, g.GrantID, "admin", "test", time.Now())
	if err != nil || rev.Revoked == nil || !first {
		t.Fatalf("revoke: %+v %v %v", rev, first, err)
	}
	again, second, err := grants.Revoke(ctx, f.JS, f.Store, g.GrantID, "admin2", "again", time.Now())
	if err != nil || second || again.Revoked.By != "admin" {
		t.Fatalf("revoking again: %+v %v %v, want the first revocation kept", again.Revoked, second, err)
	}
	f.redriveFails(turn, schemas.CodeGrantRevoked)
	if ev := f.grantEvents(schemas.GrantRevoked, g.GrantID); len(ev) != 1 || ev[0].By != "admin" {
		t.Fatalf("revoked events %+v", ev)
	}
	// Each stage counts what it did, once: the approver the grant it made,
	// the executor the approval the grant decided, the redriver the
	// re-check that stopped the call.
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"tollgate_grants_created_total", nil},
		{"tollgate_grants_used_total", map[string]string{"effect": "approved"}},
		{"tollgate_grant_rechecks_failed_total", map[string]string{"code": string(schemas.CodeGrantRevoked)}},
	} {
		if got := f.Metric(c.name, c.labels); got != 1 {
			t.Errorf("%s%v = %v, want 1", c.name, c.labels, got)
		}
	}
	// And it decides nothing from now on.
	_, id := f.send("s-alice-3", "alice", schemas.ChannelDM, callCount(3))
	f.prompted(id)
}

func TestExpiredGrantFailsAtRedriveAndDecidesNothing(t *testing.T) {
	f := redriveFixture(t)
	g, turn := f.grantedAwaiting("alice")
	// Let it expire: the record as the approver would have written it had
	// "for" been shorter (resealed with the ring: an honest record).
	ctx, cancel := f.Ctx()
	defer cancel()
	if _, _, err := f.Store.Grants.Mutate(ctx, g.GrantID, func(g *schemas.Grant) error {
		g.ExpiresAt = time.Now().UTC().Add(-time.Second)
		return f.Keys.SealGrant(g)
	}); err != nil {
		t.Fatal(err)
	}
	f.redriveFails(turn, schemas.CodeGrantExpired)
	_, id := f.send("s-alice-3", "alice", schemas.ChannelDM, callCount(3))
	f.prompted(id)
}

func TestForgedGrantNamedByAnApprovalFailsAtRedrive(t *testing.T) {
	f := redriveFixture(t)
	g, turn := f.grantedAwaiting("alice")
	// Rewrite the grant in KV, wider, keeping its old MAC.
	ctx, cancel := f.Ctx()
	defer cancel()
	if _, _, err := f.Store.Grants.Mutate(ctx, g.GrantID, func(g *schemas.Grant) error {
		g.ExpiresAt = g.ExpiresAt.Add(365 * 24 * time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	f.redriveFails(turn, schemas.CodeGrantInvalid)
}

func TestGrantFromAnOlderPolicyVersion(t *testing.T) {
	f := redriveFixture(t)
	_, turn := f.grantedAwaiting("alice")
	f.Stop()
	// The policy no longer offers count's grant options.
	f2 := start(t, noGrantPolicy, f.Env, pipelinetest.Ingest, pipelinetest.Executor, pipelinetest.Approver)
	f2.count = f.count
	r := f2.redriveFails(turn, schemas.CodeGrantRevoked)
	if !strings.Contains(r.Reason, "grants-v2") || !strings.Contains(r.Reason, "no longer offers") {
		t.Fatalf("reason %q does not say the policy changed", r.Reason)
	}
	_, id := f2.send("s-alice-3", "alice", schemas.ChannelDM, callCount(3))
	f2.prompted(id)
}

// TestNoGrantIsLookedUpForAToolThePolicyOffersNoneFor: a call of a tool
// whose rule has no grant option reads nothing of tollgate_grants before
// its approval is created (no grant of the tool could decide it: one made
// under an earlier policy version that offered it is refused), and it is
// prompted; a tool with grant options still has its grant index read.
func TestNoGrantIsLookedUpForAToolThePolicyOffersNoneFor(t *testing.T) {
	f := start(t, noGrantPolicy, nil)
	reads := f.Gets("KV_" + topology.BucketGrants)
	// readsBefore is the grant reads up to a later one of marker's key.
	readsBefore := func(marker string) (n int) {
		t.Helper()
		ctx, cancel := f.Ctx()
		defer cancel()
		if _, _, err := f.Store.GrantIndexes.Get(ctx, marker); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the marker read: %v, want not found", err)
		}
		for {
			select {
			case m := <-reads:
				if strings.Contains(m.Subject+string(m.Data), marker) {
					return n
				}
				n++
			case <-jstest.After(pipelinetest.Wait):
				t.Fatalf("the marker read never came (%d reads before it)", n)
			}
		}
	}

	_, id := f.send("s-nogrant", "alice", schemas.ChannelDM, callCount(1)) // count offers no grant in this version
	f.prompted(id)
	if n := readsBefore("gi-marker-count"); n != 0 {
		t.Fatalf("%d reads of %s for a tool the policy offers no grant for, want none", n, topology.BucketGrants)
	}
	_, id = f.send("s-grantable", "alice", schemas.ChannelDM, writeFile("docs/a.txt")) // write_file still offers one
	f.prompted(id)
	if n := readsBefore("gi-marker-write"); n == 0 {
		t.Fatalf("no read of %s for a tool the policy offers a grant for: the probe sees nothing", topology.BucketGrants)
	}
}
