package approver_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// decidersPolicy: by default (file rule) the requester, cli:bob and group
// ops decide; "audit" on team turns only group sec; "strong_op" the
// requester and ops with a second factor; "nored" only cli:bob; "quorum_op"
// two distinct members of ops.
const decidersPolicy = `{
  "version": "deciders-approver-test",
  "groups": {"ops": ["cli:olga", "cli:oscar", "cli:otto"], "sec": ["cli:sam"]},
  "deciders": {"principals": ["cli:bob"], "groups": ["ops"]},
  "tools": {
    "count":     {"approval": "required"},
    "audit":     {"approval": "required", "audience_deciders": {"team": {"requester": false, "groups": ["sec"]}}},
    "strong_op": {"approval": "required", "deciders": {"groups": ["ops"], "min_assurance": "strong"}},
    "nored":     {"approval": "required", "deciders": {"requester": false, "principals": ["cli:bob"]}},
    "quorum_op": {"approval": "required", "deciders": {"requester": false, "groups": ["ops"], "quorum": 2}}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// counters returns one counting tool per tool of decidersPolicy.
func counters() (map[string]*pt.Counter, []tools.Tool) {
	m := map[string]*pt.Counter{}
	var ts []tools.Tool
	for _, name := range []string{"count", "audit", "strong_op", "nored", "quorum_op"} {
		c := &pt.Counter{ToolName: name}
		m[name] = c
		ts = append(ts, c)
	}
	return m, ts
}

// who is a decider as its transport (cli) vouches for them.
type who struct {
	id        string
	transport string // "" is cli
	verified  bool
	strong    bool
	channel   schemas.ChannelKind // where the decision was posted; "" for not said
}

func verified(id string) who { return who{id: id, verified: true} }

func (w who) decision(h *pt.H, approvalID, option string) *schemas.Decision {
	tr := w.transport
	if tr == "" {
		tr = "cli"
	}
	d := h.Decision(approvalID, option, tr, w.id)
	d.Decider.Verified, d.Decider.Strong = w.verified, w.strong
	if w.channel != "" {
		d.Channel = &schemas.Channel{ID: "c-" + string(w.channel), Kind: w.channel}
	}
	return d
}

// pendingCall sends alice's turn with one call of tool, posted in a channel
// of kind, and waits for its approval to be pending.
func pendingCall(h *pt.H, session, tool string, kind schemas.ChannelKind) (turn, approvalID string) {
	h.T.Helper()
	m := h.Inbound(session, "alice", pt.Call(tool, fmt.Sprintf(`{"session":%q}`, session)))
	m.Channel = schemas.Channel{ID: string(kind) + "-" + session, Kind: kind}
	turn = h.Send(m)
	approvalID = schemas.ApprovalID(turn, 0)
	a := h.WaitPending(approvalID)
	want, _ := schemas.AudienceOf(kind)
	if a.Context.Audience != want {
		h.T.Fatalf("turn audience %s, want %s", a.Context.Audience, want)
	}
	return turn, approvalID
}

func TestOnlyAuthorizedDecidersDecide(t *testing.T) {
	count, ts := counters()
	h := pt.Start(t, pt.Options{Policy: decidersPolicy, Tools: ts})
	dm, team := schemas.ChannelDM, schemas.ChannelPrivate
	strong := func(id string) who { return who{id: id, verified: true, strong: true} }
	tests := []struct {
		name string
		tool string
		turn schemas.ChannelKind // where alice's turn was posted
		by   who
		ok   bool
		// closer, for a rejected decision, is an authorized decider whose
		// approval then applies: the rejected one left nothing behind.
		closer who
	}{
		{name: "the requester of a personal turn", tool: "count", turn: dm, by: verified("alice"), ok: true},
		{name: "a principal the file rule names", tool: "count", turn: dm, by: verified("bob"), ok: true},
		{name: "a member of a group the file rule names", tool: "count", turn: dm, by: verified("oscar"), ok: true},
		{name: "someone in no rule or group", tool: "count", turn: dm, by: verified("mallory"), closer: verified("alice")},
		{name: "a member of a group the rule does not name", tool: "count", turn: dm, by: verified("sam"), closer: verified("alice")},
		{name: "a group member's id on another transport", tool: "count", turn: dm, by: who{id: "olga", transport: "slack", verified: true}, closer: verified("olga")},
		{name: "an unverified sender claiming the requester's id", tool: "count", turn: dm, by: who{id: "alice"}, closer: verified("alice")},
		{name: "an unverified sender claiming a member's id with strong set", tool: "count", turn: dm, by: who{id: "olga", strong: true}, closer: verified("olga")},
		{name: "a verified-only member where the rule needs strong", tool: "strong_op", turn: dm, by: verified("olga"), closer: strong("olga")},
		{name: "the verified-only requester where the rule needs strong", tool: "strong_op", turn: dm, by: verified("alice"), closer: strong("alice")},
		{name: "a strongly verified member where the rule needs strong", tool: "strong_op", turn: dm, by: strong("otto"), ok: true},
		{name: "the requester where the rule says requester false", tool: "nored", turn: dm, by: verified("alice"), closer: verified("bob")},
		{name: "the principal a requester-false rule names", tool: "nored", turn: dm, by: verified("bob"), ok: true},
		{name: "a file-rule member where a tool rule replaces the file rule", tool: "nored", turn: dm, by: verified("olga"), closer: verified("bob")},
		{name: "a decision from a public channel on a personal turn", tool: "count", turn: dm, by: from(verified("alice"), schemas.ChannelPublic), closer: verified("alice")},
		{name: "a decision from a private channel on a personal turn", tool: "count", turn: dm, by: from(verified("alice"), schemas.ChannelPrivate), closer: from(verified("alice"), dm)},
		{name: "a decision from a dm on a personal turn", tool: "count", turn: dm, by: from(verified("alice"), dm), ok: true},
		{name: "a decision from a dm on a team turn", tool: "count", turn: team, by: from(verified("bob"), dm), ok: true},
		{name: "a decision from a private channel on a team turn", tool: "count", turn: team, by: from(verified("alice"), schemas.ChannelPrivate), ok: true},
		{name: "a decision from a public channel on a team turn", tool: "count", turn: team, by: from(verified("bob"), schemas.ChannelPublic), closer: from(verified("bob"), team)},
		{name: "the requester of a team turn whose audience rule excludes them", tool: "audit", turn: team, by: verified("alice"), closer: verified("sam")},
		{name: "a file-rule member on a team turn whose audience rule replaces the file rule", tool: "audit", turn: team, by: verified("olga"), closer: verified("sam")},
		{name: "the group an audience rule names, on a team turn", tool: "audit", turn: team, by: verified("sam"), ok: true},
		{name: "the requester of a personal turn of a tool with only a team rule", tool: "audit", turn: dm, by: verified("alice"), ok: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			turn, id := pendingCall(h, fmt.Sprintf("deciders%d", i), tc.tool, tc.turn)
			call := schemas.CallID(turn, 0)
			d := tc.by.decision(h, id, schemas.OptionApprove)
			h.Submit(d)
			if !tc.ok {
				rej := h.WaitRejection(d)
				if rej.Code != schemas.CodeDeciderNotAuthorized || rej.Principal != schemas.Principal(d.Transport, d.Decider.ID) {
					t.Fatalf("rejection %+v, want DECIDER_NOT_AUTHORIZED for %s", rej, d.Decider.ID)
				}
				a := h.Approval(id)
				if a.Status != schemas.ApprovalPending || a.Decision != nil || len(a.Votes) != 0 {
					t.Fatalf("approval %s decision %+v votes %+v after a rejected decision, want pending and untouched", a.Status, a.Decision, a.Votes)
				}
				if b := h.Batch(turn); b.State != schemas.BatchAwaiting {
					t.Fatalf("batch %s after a rejected decision", b.State)
				}
				if n := len(h.Decisions(turn)); n != 0 {
					t.Fatalf("%d decided events after a rejected decision", n)
				}
				if n := count[tc.tool].Runs(call); n != 0 {
					t.Fatalf("tool ran %d times on a rejected decision", n)
				}
				d = tc.closer.decision(h, id, schemas.OptionApprove)
				h.Submit(d)
			}
			b, out := h.WaitTerminal(turn)
			if r := b.Results[0]; r.Status != schemas.ResultOK || out.State != schemas.TurnCompleted {
				t.Fatalf("result %+v outcome %s, want ok", r, out.State)
			}
			a := h.Approval(id)
			if a.Status != schemas.ApprovalApproved || a.Decision == nil || a.Decision.DecisionID != d.DecisionID {
				t.Fatalf("approval %s decided by %+v, want approved by %s", a.Status, a.Decision, d.DecisionID)
			}
			if a.Decision.Principal != schemas.Principal(d.Transport, d.Decider.ID) || a.Decision.Assurance != d.Decider.Assurance() {
				t.Fatalf("decision recorded %+v, want %s at assurance %d", a.Decision, d.Decider.ID, d.Decider.Assurance())
			}
			if n := count[tc.tool].Runs(call); n != 1 {
				t.Fatalf("tool ran %d times, want once", n)
			}
			if tc.ok {
				if rej := h.Rejections(id); len(rej) != 0 {
					t.Fatalf("an authorized decision was rejected: %+v", rej[0])
				}
			}
		})
	}
}

// TestMultiApproverQuorum: quorum_op needs two distinct members of ops; the
// requester is not among its deciders.
func TestMultiApproverQuorum(t *testing.T) {
	count, ts := counters()
	h := pt.Start(t, pt.Options{Policy: decidersPolicy, Tools: ts})
	q := count["quorum_op"]

	// vote submits an approve (or deny) by w and waits until the approver
	// has handled it.
	vote := func(h *pt.H, id, option string, w who) *schemas.Decision {
		h.T.Helper()
		d := w.decision(h, id, option)
		h.WaitConsumed(pt.Approver, h.Submit(d))
		return d
	}
	// stillPending checks that id is pending with exactly the votes of
	// principals, no decided event exists and nothing ran.
	stillPending := func(h *pt.H, turn, id string, principals ...string) {
		h.T.Helper()
		a := h.Approval(id)
		if a.Status != schemas.ApprovalPending || a.Decision != nil || a.Quorum != 2 {
			h.T.Fatalf("approval %s decision %+v quorum %d, want pending with quorum 2", a.Status, a.Decision, a.Quorum)
		}
		if len(a.Votes) != len(principals) {
			h.T.Fatalf("votes %+v, want %v", a.Votes, principals)
		}
		for i, p := range principals {
			if a.Votes[i].Principal != p || a.Votes[i].Option != schemas.OptionApprove || a.Votes[i].Assurance != schemas.AssuranceVerified {
				h.T.Fatalf("vote %d %+v, want an approve by %s at verified", i, a.Votes[i], p)
			}
		}
		if evs := h.Decisions(turn); len(evs) != 0 {
			h.T.Fatalf("%d decided events before the quorum was reached", len(evs))
		}
		if b := h.Batch(turn); b.State != schemas.BatchAwaiting {
			h.T.Fatalf("batch %s before the quorum was reached", b.State)
		}
		if n := q.Runs(schemas.CallID(turn, 0)); n != 0 {
			h.T.Fatalf("tool ran %d times before the quorum was reached", n)
		}
	}

	t.Run("the second distinct member's approval approves and the call runs once", func(t *testing.T) {
		h := h.For(t)
		turn, id := pendingCall(h, "quorum-approve", "quorum_op", schemas.ChannelDM)
		votesBefore := h.Metric("tollgate_decisions_total", map[string]string{"result": "vote"})

		vote(h, id, schemas.OptionApprove, verified("olga"))
		stillPending(h, turn, id, "cli:olga")
		if got := h.Metric("tollgate_decisions_total", map[string]string{"result": "vote"}); got != votesBefore+1 {
			t.Fatalf("vote metric %v, want %v", got, votesBefore+1)
		}

		// The vote is an event: who voted, the votes so far and the quorum.
		voted := pt.DecodeAll[schemas.VotedEvent](h.T, h.Events(topology.EventSubject(topology.SubjectApprovalVoted, turn)))
		if len(voted) != 1 || voted[0].ApprovalID != id || voted[0].Vote.Principal != "cli:olga" || voted[0].Quorum != 2 || len(voted[0].Votes) != 1 {
			t.Fatalf("voted events %+v, want one: cli:olga's, 1 of 2", voted)
		}
		// The same member again: an idempotent success, not a second vote.
		vote(h, id, schemas.OptionApprove, verified("olga"))
		vote(h, id, schemas.OptionApprove, from(verified("olga"), schemas.ChannelDM))
		stillPending(h, turn, id, "cli:olga")
		if n := len(h.Events(topology.EventSubject(topology.SubjectApprovalVoted, turn))); n != 1 {
			t.Fatalf("%d voted events after the repeats, want 1", n)
		}

		// Deciders who do not qualify do not add votes either.
		unauthorized(h, id, schemas.OptionApprove, verified("alice"), verified("mallory"), verified("sam"), who{id: "oscar"})
		stillPending(h, turn, id, "cli:olga")
		if rej := h.Rejections(id); len(rej) != 4 {
			t.Fatalf("%d rejections, want only the 4 unqualified deciders'", len(rej))
		}

		last := vote(h, id, schemas.OptionApprove, verified("oscar"))
		b, out := h.WaitTerminal(turn)
		if r := b.Results[0]; r.Status != schemas.ResultOK || out.State != schemas.TurnCompleted {
			t.Fatalf("result %+v outcome %s", r, out.State)
		}
		a := h.Approval(id)
		if a.Status != schemas.ApprovalApproved || a.Decision == nil || a.Decision.DecisionID != last.DecisionID || len(a.Votes) != 2 || a.Votes[1].Principal != "cli:oscar" {
			t.Fatalf("approval %s decision %+v votes %+v", a.Status, a.Decision, a.Votes)
		}
		evs := h.Decisions(turn)
		if len(evs) != 1 || evs[0].Status != schemas.ApprovalApproved || evs[0].Decision == nil || evs[0].Decision.Principal != "cli:oscar" {
			t.Fatalf("decided events %+v, want one approved by the second member", evs)
		}
		// The event carries the votes too: the record can be rebuilt from it.
		if !slices.EqualFunc(evs[0].Votes, a.Votes, func(x, y schemas.DecisionInfo) bool {
			return x.Principal == y.Principal && x.DecisionID == y.DecisionID
		}) {
			t.Fatalf("decided event votes %+v, want the record's %+v", evs[0].Votes, a.Votes)
		}

		// A third member's approval afterwards changes nothing.
		vote(h, id, schemas.OptionApprove, verified("otto"))
		h.WaitIdle(pt.Approver, pt.Redriver)
		if n := q.Runs(schemas.CallID(turn, 0)); n != 1 {
			t.Fatalf("tool ran %d times, want once", n)
		}
		if n := len(h.Outcomes(turn)); n != 1 {
			t.Fatalf("%d outcomes", n)
		}
		if a := h.Approval(id); len(a.Votes) != 2 || a.Decision.DecisionID != last.DecisionID {
			t.Fatalf("a vote after the quorum changed the record: %+v %+v", a.Decision, a.Votes)
		}
	})

	t.Run("a member's deny after one approval denies and nothing runs", func(t *testing.T) {
		h := h.For(t)
		turn, id := pendingCall(h, "quorum-deny", "quorum_op", schemas.ChannelDM)
		vote(h, id, schemas.OptionApprove, verified("olga"))
		stillPending(h, turn, id, "cli:olga")

		deny := vote(h, id, schemas.OptionDeny, verified("oscar"))
		b, _ := h.WaitTerminal(turn)
		if r := b.Results[0]; r.Status != schemas.ResultDenied || r.Code != schemas.CodeApprovalDenied {
			t.Fatalf("result %+v, want denied", r)
		}
		a := h.Approval(id)
		if a.Status != schemas.ApprovalDenied || a.Decision == nil || a.Decision.DecisionID != deny.DecisionID {
			t.Fatalf("approval %s decided by %+v, want denied by %s", a.Status, a.Decision, deny.DecisionID)
		}
		if evs := h.Decisions(turn); len(evs) != 1 || evs[0].Status != schemas.ApprovalDenied {
			t.Fatalf("decided events %+v, want one denied", evs)
		}
		// The quorum can no longer be reached: a later approve conflicts.
		late := otto(h, id)
		if rej := h.WaitRejection(late); rej.Code != schemas.CodeApprovalAlreadyDecided {
			t.Fatalf("late approve: %s, want APPROVAL_ALREADY_DECIDED", rej.Code)
		}
		h.WaitIdle(pt.Approver, pt.Redriver)
		if n := q.Runs(schemas.CallID(turn, 0)); n != 0 {
			t.Fatalf("denied call ran %d times", n)
		}
	})

	// Each of these leaves exactly olga's vote; otto's approval then runs
	// the call once.
	for i, tc := range []struct {
		name  string
		first func(h *pt.H, id string)
	}{
		{"an unqualified deny does not deny", func(h *pt.H, id string) {
			vote(h, id, schemas.OptionApprove, verified("olga"))
			unauthorized(h, id, schemas.OptionDeny, verified("alice"), verified("mallory"), from(verified("oscar"), schemas.ChannelPublic))
		}},
		{"concurrent approvals by one member count once", func(h *pt.H, id string) {
			applyConcurrently(h, id, "olga", "olga", "olga", "olga", "olga", "olga")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			turn, id := pendingCall(h, fmt.Sprintf("quorum-one-vote%d", i), "quorum_op", schemas.ChannelDM)
			tc.first(h, id)
			stillPending(h, turn, id, "cli:olga")
			vote(h, id, schemas.OptionApprove, verified("otto"))
			ranOnce(h, q, turn)
		})
	}

	t.Run("concurrent approvals by three members approve once", func(t *testing.T) {
		h := h.For(t)
		turn, id := pendingCall(h, "quorum-race-three", "quorum_op", schemas.ChannelDM)
		applyConcurrently(h, id, "olga", "oscar", "otto", "olga", "oscar", "otto")
		b, _ := h.WaitTerminal(turn)
		h.WaitIdle(pt.Approver, pt.Redriver)
		if b.Results[0].Status != schemas.ResultOK {
			t.Fatalf("result %+v", b.Results[0])
		}
		a := h.Approval(id)
		if a.Status != schemas.ApprovalApproved || len(a.Votes) != 2 || a.Votes[0].Principal == a.Votes[1].Principal {
			t.Fatalf("approval %s votes %+v, want approved by two distinct members", a.Status, a.Votes)
		}
		if evs := h.Decisions(turn); len(evs) != 1 {
			t.Fatalf("%d decided events, want 1", len(evs))
		}
		if rej := h.Rejections(id); len(rej) != 0 {
			t.Fatalf("rejections %+v", rej)
		}
		if n := q.Runs(schemas.CallID(turn, 0)); n != 1 {
			t.Fatalf("tool ran %d times, want once", n)
		}
	})
}

func from(w who, k schemas.ChannelKind) who { w.channel = k; return w }

// unauthorized submits option on approvalID by each of ws and checks that
// each is rejected with DECIDER_NOT_AUTHORIZED.
func unauthorized(h *pt.H, approvalID, option string, ws ...who) {
	h.T.Helper()
	for _, w := range ws {
		d := w.decision(h, approvalID, option)
		h.Submit(d)
		if rej := h.WaitRejection(d); rej.Code != schemas.CodeDeciderNotAuthorized {
			h.T.Fatalf("%+v: rejection %s, want DECIDER_NOT_AUTHORIZED", w, rej.Code)
		}
	}
}

// ranOnce waits for turn to end and checks that its only call succeeded,
// having run exactly once.
func ranOnce(h *pt.H, c *pt.Counter, turn string) {
	h.T.Helper()
	if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultOK {
		h.T.Fatalf("result %+v, want ok", b.Results[0])
	}
	if n := c.Runs(schemas.CallID(turn, 0)); n != 1 {
		h.T.Fatalf("tool ran %d times, want once", n)
	}
}

func otto(h *pt.H, id string) *schemas.Decision {
	d := verified("otto").decision(h, id, schemas.OptionApprove)
	h.Submit(d)
	return d
}

// applyConcurrently applies an approve by each of ids (verified cli users)
// at once, through the approver's Apply (racing on compare-and-set).
func applyConcurrently(h *pt.H, approvalID string, ids ...string) {
	h.T.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, id := range ids {
		d := verified(id).decision(h, approvalID, schemas.OptionApprove)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := h.Ctx()
			defer cancel()
			if err := h.Approver.Apply(ctx, d); err != nil {
				h.T.Errorf("apply %s: %v", d.DecisionID, err)
			}
		}()
	}
	close(start)
	wg.Wait()
}
