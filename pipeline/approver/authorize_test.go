package approver_test

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// authorizePolicy: write_file is decided by the requester, cli:bob (global
// approver) or cli:carol (its own); "count" offers only approve;
// "strong_op" needs a member of ops with a second factor; "quorum_op" two
// distinct members of ops.
const authorizePolicy = `{
  "version": "authorize-test",
  "approvers": ["cli:bob"],
  "groups": {"ops": ["cli:olga", "cli:oscar"]},
  "tools": {
    "write_file": {"approval": "required", "approvers": ["cli:carol"]},
    "count":      {"approval": "required", "options": ["approve"]},
    "strong_op":  {"approval": "required", "deciders": {"groups": ["ops"], "min_assurance": "strong"}},
    "quorum_op":  {"approval": "required", "deciders": {"requester": false, "groups": ["ops"], "quorum": 2}}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

var authNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var (
	authTurn  = schemas.TurnID("cli", "m-authorize")
	otherTurn = schemas.TurnID("cli", "m-other")
)

func keyRing(t *testing.T, id string, fill byte) *seal.KeyRing {
	t.Helper()
	r, err := seal.New(id, map[string][]byte{id: bytes.Repeat([]byte{fill}, seal.MinKeyBytes)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sealedContext is alice's personal (DM) turn on cli, sealed with keys.
func sealedContext(t *testing.T, keys *seal.KeyRing, turn string) *schemas.TurnContext {
	t.Helper()
	tc := &schemas.TurnContext{
		V: schemas.TurnContextVersion, SessionID: "s-authorize", TurnID: turn,
		Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
		Transport: "cli", Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM},
		Audience: schemas.AudiencePersonal, TrustBoundary: "local", Interactive: true,
		Provenance: schemas.Provenance{Transport: "cli", MessageID: "m-authorize", StreamSeq: 7, ReceivedAt: authNow.Add(-time.Hour), IngestedBy: "ingest-test"},
		CreatedAt:  authNow.Add(-time.Hour),
	}
	if err := keys.Seal(tc); err != nil {
		t.Fatal(err)
	}
	return tc
}

// pendingRecord is the approval of alice's call of tool as the executor
// requested it an hour before authNow, expiring an hour after.
func pendingRecord(t *testing.T, keys *seal.KeyRing, pol *policy.Policy, tool string) *schemas.ApprovalRecord {
	t.Helper()
	args, digest, err := schemas.CanonicalArgs(`{"path":"a.txt","content":"x"}`)
	if err != nil {
		t.Fatal(err)
	}
	tc := sealedContext(t, keys, authTurn)
	return &schemas.ApprovalRecord{
		V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(authTurn, 0), TurnID: authTurn, SessionID: "s-authorize",
		CallID: schemas.CallID(authTurn, 0), Context: tc, Tool: tool, Args: args, ArgsDigest: digest,
		PolicyVersion: pol.Version(), Options: pol.Options(tool), Status: schemas.ApprovalPending,
		RequestedAt: authNow.Add(-time.Hour), ExpiresAt: authNow.Add(time.Hour), Quorum: pol.Quorum(tool, tc),
	}
}

// verifiedDecision is a decision by cli user id, verified, without a
// channel or digest.
func verifiedDecision(approvalID, option, id string) *schemas.Decision {
	return &schemas.Decision{
		V: schemas.DecisionVersion, DecisionID: "d-" + id + "-" + option, ApprovalID: approvalID, Transport: "cli",
		Decider: schemas.Sender{ID: id, Kind: schemas.SenderUser, Verified: true}, Option: option, SentAt: authNow,
		Note: "checked the path first",
	}
}

// decided returns r decided with option by cli:id.
func decided(r *schemas.ApprovalRecord, status schemas.ApprovalStatus, option, id string) *schemas.ApprovalRecord {
	r.Status = status
	r.Decision = &schemas.DecisionInfo{DecisionID: "d-" + id + "-" + option, Principal: "cli:" + id, Option: option, DecidedAt: authNow.Add(-time.Minute)}
	return r
}

func vote(id string) schemas.DecisionInfo {
	return schemas.DecisionInfo{DecisionID: "d-" + id, Principal: "cli:" + id, Option: schemas.OptionApprove, DecidedAt: authNow.Add(-time.Minute), Assurance: schemas.AssuranceVerified}
}

func TestAuthorize(t *testing.T) {
	pol, err := policy.Parse([]byte(authorizePolicy))
	if err != nil {
		t.Fatal(err)
	}
	keys := keyRing(t, "k1", 0x11)
	type (
		rec = schemas.ApprovalRecord
		dec = schemas.Decision
	)
	approve, deny := schemas.OptionApprove, schemas.OptionDeny
	tests := []struct {
		name string
		tool string // "" is write_file
		// setup changes the pending record and alice's approve; either may
		// be replaced (nil included).
		setup func(r *rec, d *dec) (*rec, *dec)
		code  schemas.Code // "" accepted
		// Accepted, or rejected with a record change:
		effect approver.Effect
		next   schemas.ApprovalStatus // status of Verdict.Next; "" for no Next
		votes  int                    // votes in Verdict.Next
		by     string                 // principal of Verdict.Next's decision
	}{
		// Malformed or missing.
		{name: "no decision at all", setup: func(r *rec, _ *dec) (*rec, *dec) { return r, nil }, code: schemas.CodeInvalidInput},
		{name: "a decision for an approval that does not exist", setup: func(_ *rec, d *dec) (*rec, *dec) { return nil, d }, code: schemas.CodeApprovalNotFound},
		{name: "a record of another approval than the decision names", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.ApprovalID = schemas.ApprovalID(authTurn, 1)
			return r, d
		}, code: schemas.CodeApprovalNotFound},
		{name: "a record in a status that does not exist", setup: func(r *rec, d *dec) (*rec, *dec) { r.Status = "approvedish"; return r, d }, code: schemas.CodeInvalidInput},

		// Forged or tampered authority.
		{name: "a record without a TurnContext", setup: func(r *rec, d *dec) (*rec, *dec) { r.Context = nil; return r, d }, code: schemas.CodeTurnContextMissing},
		{name: "a TurnContext of an unknown version", setup: func(r *rec, d *dec) (*rec, *dec) { r.Context.V = 9; return r, d }, code: schemas.CodeSchemaVersionUnsupported},
		{name: "a TurnContext with no audience", setup: func(r *rec, d *dec) (*rec, *dec) { r.Context.Audience = ""; return r, d }, code: schemas.CodeTurnContextInvalid},
		{name: "a TurnContext without a seal", setup: func(r *rec, d *dec) (*rec, *dec) { r.Context.Seal = nil; return r, d }, code: schemas.CodeTurnContextTampered},
		{name: "a requester edited after sealing to name the attacker", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Context.Requester.Principal, r.Context.Requester.SenderID = "cli:mallory", "mallory"
			d.Decider.ID = "mallory"
			return r, d
		}, code: schemas.CodeTurnContextTampered},
		{name: "an audience widened after sealing", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Context.Audience = schemas.AudiencePublic
			return r, d
		}, code: schemas.CodeTurnContextTampered},
		{name: "a TurnContext sealed with a key the ring does not hold", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Context = sealedContext(t, keyRing(t, "k9", 0x11), authTurn)
			return r, d
		}, code: schemas.CodeSealKeyUnknown},
		{name: "a TurnContext forged with another key under a known key id", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Context = sealedContext(t, keyRing(t, "k1", 0x22), authTurn)
			return r, d
		}, code: schemas.CodeTurnContextTampered},
		{name: "another turn's authentic TurnContext swapped in", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Context = sealedContext(t, keys, otherTurn)
			return r, d
		}, code: schemas.CodeTurnContextMismatch},

		// Deciders.
		{name: "another principal on the same transport", setup: func(r *rec, d *dec) (*rec, *dec) { d.Decider.ID = "mallory"; return r, d }, code: schemas.CodeDeciderNotAuthorized},
		{name: "the requester's sender id on another transport", setup: func(r *rec, d *dec) (*rec, *dec) { d.Transport = "slack"; return r, d }, code: schemas.CodeDeciderNotAuthorized},
		{name: "an unverified sender claiming the requester's id", setup: func(r *rec, d *dec) (*rec, *dec) { d.Decider.Verified = false; return r, d }, code: schemas.CodeDeciderNotAuthorized},
		{name: "an unverified sender claiming a second factor", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Decider.Verified, d.Decider.Strong = false, true
			return r, d
		}, code: schemas.CodeDeciderNotAuthorized},
		{name: "a bot with the requester's id", setup: func(r *rec, d *dec) (*rec, *dec) { d.Decider.Kind = schemas.SenderBot; return r, d }, code: schemas.CodeDeciderNotAuthorized},
		{name: "a service with the requester's id", setup: func(r *rec, d *dec) (*rec, *dec) { d.Decider.Kind = schemas.SenderService; return r, d }, code: schemas.CodeDeciderNotAuthorized},
		{name: "an approver named for another tool", tool: "count", setup: func(r *rec, d *dec) (*rec, *dec) { d.Decider.ID = "carol"; return r, d }, code: schemas.CodeDeciderNotAuthorized},
		{name: "a verified-only group member where the rule needs a second factor", tool: "strong_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Decider.ID = "olga"
			return r, d
		}, code: schemas.CodeDeciderNotAuthorized},
		{name: "the requester where the rule leaves the requester out", tool: "quorum_op", code: schemas.CodeDeciderNotAuthorized},
		{name: "a decision posted in a public channel on a personal turn", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Channel = &schemas.Channel{ID: "general", Kind: schemas.ChannelPublic}
			return r, d
		}, code: schemas.CodeDeciderNotAuthorized},
		{name: "a decision posted in a private channel on a personal turn", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Channel = &schemas.Channel{ID: "team", Kind: schemas.ChannelPrivate}
			return r, d
		}, code: schemas.CodeDeciderNotAuthorized},
		{name: "a decision posted in a channel of an unknown kind", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Channel = &schemas.Channel{ID: "x", Kind: "broadcast"}
			return r, d
		}, code: schemas.CodeDeciderNotAuthorized},

		// Bound to the exact call.
		{name: "a digest of other arguments", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.ArgsDigest = schemas.ArgsDigest(`{"content":"x","path":"../../etc/passwd"}`)
			return r, d
		}, code: schemas.CodeArgsDigestMismatch},
		{name: "an option the prompt did not offer", tool: "count", setup: func(r *rec, d *dec) (*rec, *dec) { d.Option = deny; return r, d }, code: schemas.CodeOptionNotOffered},
		{name: "an option that does not exist", setup: func(r *rec, d *dec) (*rec, *dec) { d.Option = "maybe"; return r, d }, code: schemas.CodeOptionNotOffered},

		// Out of order, replayed, duplicated, expired.
		{name: "a deny after an approve", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Option = deny
			return decided(r, schemas.ApprovalApproved, approve, "bob"), d
		}, code: schemas.CodeApprovalAlreadyDecided},
		{name: "an approve after a deny", setup: func(r *rec, d *dec) (*rec, *dec) {
			return decided(r, schemas.ApprovalDenied, deny, "bob"), d
		}, code: schemas.CodeApprovalAlreadyDecided},
		{name: "an approve after the approval was abandoned", setup: func(r *rec, d *dec) (*rec, *dec) {
			return decided(r, schemas.ApprovalAbandoned, "", "tollgate"), d
		}, code: schemas.CodeApprovalAlreadyDecided},
		{name: "a decision on an approval already expired", setup: func(r *rec, d *dec) (*rec, *dec) {
			return decided(r, schemas.ApprovalExpired, "", "expiry"), d
		}, code: schemas.CodeApprovalExpired},
		{name: "a decision at the instant the approval expires", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.ExpiresAt = authNow
			return r, d
		}, code: schemas.CodeApprovalExpired, next: schemas.ApprovalExpired, by: approver.ExpiryPrincipal},
		{name: "a decision after the approval expired that nobody recorded yet", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.ExpiresAt = authNow.Add(-time.Second)
			return r, d
		}, code: schemas.CodeApprovalExpired, next: schemas.ApprovalExpired, by: approver.ExpiryPrincipal},
		{name: "a quorum vote after the approval expired", tool: "quorum_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.ExpiresAt = authNow.Add(-time.Second)
			d.Decider.ID = "olga"
			return r, d
		}, code: schemas.CodeApprovalExpired, next: schemas.ApprovalExpired, by: approver.ExpiryPrincipal},

		// The order of the checks: authority before the call, the call before the state.
		{name: "an unauthorized decider on a decided approval is told it is not authorized", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Decider.ID = "mallory"
			return decided(r, schemas.ApprovalApproved, approve, "alice"), d
		}, code: schemas.CodeDeciderNotAuthorized},
		{name: "a tampered context with a digest of other arguments is told the context is tampered", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Context.TrustBoundary = "elsewhere"
			d.ArgsDigest = schemas.ArgsDigest(`{}`)
			return r, d
		}, code: schemas.CodeTurnContextTampered},
		{name: "a digest of other arguments on an expired approval is told the digest differs", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.ExpiresAt = authNow.Add(-time.Second)
			d.ArgsDigest = schemas.ArgsDigest(`{}`)
			return r, d
		}, code: schemas.CodeArgsDigestMismatch},

		// Accepted.
		{name: "the requester approves", effect: approver.Applied, next: schemas.ApprovalApproved, by: "cli:alice"},
		{name: "the global approver denies", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Decider.ID, d.Option = "bob", deny
			return r, d
		}, effect: approver.Applied, next: schemas.ApprovalDenied, by: "cli:bob"},
		{name: "the tool's own approver approves with the digest the approval binds", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Decider.ID, d.ArgsDigest = "carol", r.ArgsDigest
			return r, d
		}, effect: approver.Applied, next: schemas.ApprovalApproved, by: "cli:carol"},
		{name: "the requester approves from the turn's own dm", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Channel = &schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}
			return r, d
		}, effect: approver.Applied, next: schemas.ApprovalApproved, by: "cli:alice"},
		{name: "a strongly verified group member where the rule needs a second factor", tool: "strong_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Decider.ID, d.Decider.Strong = "oscar", true
			return r, d
		}, effect: approver.Applied, next: schemas.ApprovalApproved, by: "cli:oscar"},
		{name: "a decision long after the request on an approval that never expires", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.RequestedAt, r.ExpiresAt = authNow.AddDate(-1, 0, 0), time.Time{}
			return r, d
		}, effect: approver.Applied, next: schemas.ApprovalApproved, by: "cli:alice"},
		{name: "the same approve again", setup: func(r *rec, d *dec) (*rec, *dec) {
			return decided(r, schemas.ApprovalApproved, approve, "alice"), d
		}, effect: approver.Idempotent},
		{name: "another decider's approve on an approved approval", setup: func(r *rec, d *dec) (*rec, *dec) {
			return decided(r, schemas.ApprovalApproved, approve, "bob"), d
		}, effect: approver.Idempotent},
		{name: "the same deny again", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Option = deny
			return decided(r, schemas.ApprovalDenied, deny, "alice"), d
		}, effect: approver.Idempotent},

		// Quorum.
		{name: "the first of two approves a quorum needs", tool: "quorum_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			d.Decider.ID = "olga"
			return r, d
		}, effect: approver.Vote, next: schemas.ApprovalPending, votes: 1},
		{name: "the same member's second approve towards the quorum", tool: "quorum_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Votes = []schemas.DecisionInfo{vote("olga")}
			d.Decider.ID = "olga"
			return r, d
		}, effect: approver.Idempotent},
		{name: "the approve that reaches the quorum", tool: "quorum_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Votes = append(make([]schemas.DecisionInfo, 0, 4), vote("olga")) // room to append in place
			d.Decider.ID = "oscar"
			return r, d
		}, effect: approver.Applied, next: schemas.ApprovalApproved, votes: 2, by: "cli:oscar"},
		{name: "one deny where a quorum of approves is needed", tool: "quorum_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Votes = []schemas.DecisionInfo{vote("olga")}
			d.Decider.ID, d.Option = "oscar", deny
			return r, d
		}, effect: approver.Applied, next: schemas.ApprovalDenied, votes: 1, by: "cli:oscar"},
		{name: "a quorum the policy raised after the request", tool: "quorum_op", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Quorum = 1
			d.Decider.ID = "olga"
			return r, d
		}, effect: approver.Vote, next: schemas.ApprovalPending, votes: 1},
		{name: "a quorum recorded at the request above the policy's", setup: func(r *rec, d *dec) (*rec, *dec) {
			r.Quorum = 2
			return r, d
		}, effect: approver.Vote, next: schemas.ApprovalPending, votes: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tool := tc.tool
			if tool == "" {
				tool = "write_file"
			}
			r := pendingRecord(t, keys, pol, tool)
			d := verifiedDecision(r.ApprovalID, approve, "alice")
			if tc.setup != nil {
				r, d = tc.setup(r, d)
			}
			before := encode(t, r)
			v, err := approver.Authorize(r, d, pol, keys, authNow)
			if after := encode(t, r); !bytes.Equal(before, after) {
				t.Fatal("Authorize changed the record it was given")
			}
			if got := schemas.CodeOf(err); got != tc.code || (err != nil) != (tc.code != "") {
				t.Fatalf("error %v, want code %q", err, tc.code)
			}
			if v.Effect != tc.effect {
				t.Fatalf("verdict %+v, want effect %q", v, tc.effect)
			}
			if tc.next == "" {
				if v.Next != nil {
					t.Fatalf("verdict stores %s, want nothing stored", v.Next.Status)
				}
				return
			}
			n := v.Next
			if n == nil || n.Status != tc.next || len(n.Votes) != tc.votes {
				t.Fatalf("verdict stores %+v, want status %s with %d votes", n, tc.next, tc.votes)
			}
			if n.ApprovalID != r.ApprovalID || n.ArgsDigest != r.ArgsDigest || n.Context != r.Context {
				t.Fatalf("stored record %+v is not the approval decided", n)
			}
			if len(r.Votes) > 0 && len(n.Votes) > len(r.Votes) && &n.Votes[0] == &r.Votes[0] {
				t.Fatal("the record to store shares its votes with the record given")
			}
			switch {
			case tc.by == "" && n.Decision != nil:
				t.Fatalf("a pending record carries decision %+v", n.Decision)
			case tc.by != "" && (n.Decision == nil || n.Decision.Principal != tc.by || !n.Decision.DecidedAt.Equal(authNow)):
				t.Fatalf("decision %+v, want by %s at %s", n.Decision, tc.by, authNow)
			case tc.by != "" && tc.by != approver.ExpiryPrincipal && (n.Decision.DecisionID != d.DecisionID || n.Decision.Option != d.Option || n.Decision.Assurance != d.Decider.Assurance() || n.Decision.Note != d.Note):
				t.Fatalf("decision %+v does not record decision %+v", n.Decision, d)
			}
		})
	}
}

// TestMayDecideIsTheDeciderRuleOfAuthorize: whoever MayDecide lists is
// exactly whoever Authorize accepts, so an inbox that shows buttons only to
// MayDecide's deciders offers them to every decider and to nobody else.
func TestMayDecideIsTheDeciderRuleOfAuthorize(t *testing.T) {
	pol, err := policy.Parse([]byte(authorizePolicy))
	if err != nil {
		t.Fatal(err)
	}
	keys := keyRing(t, "k1", 0x11)
	type candidate struct {
		name      string
		transport string
		sender    schemas.Sender
		channel   *schemas.Channel
	}
	user := func(id string) schemas.Sender {
		return schemas.Sender{ID: id, Kind: schemas.SenderUser, Verified: true}
	}
	candidates := []candidate{
		{"the requester", "cli", user("alice"), nil},
		{"the global approver", "cli", user("bob"), nil},
		{"the tool's own approver", "cli", user("carol"), nil},
		{"a group member with a second factor", "cli", schemas.Sender{ID: "olga", Kind: schemas.SenderUser, Verified: true, Strong: true}, nil},
		{"a stranger", "cli", user("mallory"), nil},
		{"the requester's id on another transport", "slack", user("alice"), nil},
		{"an unverified sender with the requester's id", "cli", schemas.Sender{ID: "alice", Kind: schemas.SenderUser}, nil},
		{"a bot with the requester's id", "cli", schemas.Sender{ID: "alice", Kind: schemas.SenderBot, Verified: true}, nil},
		{"the requester in a public channel", "cli", user("alice"), &schemas.Channel{ID: "general", Kind: schemas.ChannelPublic}},
	}
	tests := []struct {
		name   string
		tool   string
		tamper bool
		want   []string // names of the candidates who may decide
	}{
		{"write_file: the requester and both approvers", "write_file", false, []string{"the requester", "the global approver", "the tool's own approver"}},
		{"strong_op: the group member with a second factor", "strong_op", false, []string{"a group member with a second factor"}},
		{"write_file with a tampered context: nobody", "write_file", true, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := pendingRecord(t, keys, pol, tc.tool)
			if tc.tamper {
				r.Context.Requester.Principal = "cli:mallory"
			}
			var got []string
			for _, c := range candidates {
				mayErr := pol.MayDecideApproval(r, c.transport, c.sender, c.channel, keys)
				d := &schemas.Decision{DecisionID: "d-" + c.sender.ID, ApprovalID: r.ApprovalID, Transport: c.transport, Decider: c.sender, Channel: c.channel, Option: schemas.OptionApprove}
				_, authErr := approver.Authorize(r, d, pol, keys, authNow)
				if (mayErr == nil) != (authErr == nil) {
					t.Fatalf("%s: MayDecide says %v, Authorize says %v", c.name, mayErr, authErr)
				}
				if mayErr != nil && schemas.CodeOf(mayErr) == "" {
					t.Fatalf("%s: MayDecide refused without a code: %v", c.name, mayErr)
				}
				if mayErr == nil {
					got = append(got, c.name)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("deciders %q, want %q", got, tc.want)
			}
		})
	}
}

func encode(t *testing.T, r *schemas.ApprovalRecord) []byte {
	t.Helper()
	b, err := msgpack.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
