package policy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// rules has a decider rule at every level, each naming a different set of
// people, so that which rule applied shows in who may decide:
//
//   - file: the requester and group ops (olga)
//   - trust boundary "partner": tina only (no requester)
//   - tool "ruled": group sec (sam) only (no requester)
//   - tool "aud": the requester and sec; for public turns ada only
//   - tool "audonly": for public turns ada only; otherwise no tool rule
//   - tool "plain": no rule of its own
const rules = `{
  "version": "deciders",
  "groups": {"ops": ["cli:olga"], "sec": ["cli:sam"]},
  "deciders": {"groups": ["ops"]},
  "trust_boundary_deciders": {"partner": {"requester": false, "principals": ["cli:tina"]}},
  "tools": {
    "plain":   {"approval": "required"},
    "ruled":   {"approval": "required", "deciders": {"requester": false, "groups": ["sec"]}},
    "aud":     {"approval": "required", "deciders": {"groups": ["sec"]},
                "audience_deciders": {"public": {"requester": false, "principals": ["cli:ada"]}}},
    "audonly": {"approval": "required",
                "audience_deciders": {"public": {"requester": false, "principals": ["cli:ada"]}}}
  }
}`

// turn returns a persisted context of alice's turn (principal cli:alice).
func turn(audience schemas.Audience, boundary string) *schemas.TurnContext {
	return &schemas.TurnContext{
		TurnID:        "t-1",
		Requester:     schemas.Requester{Principal: "cli:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
		Transport:     "cli",
		Audience:      audience,
		TrustBoundary: boundary,
	}
}

// allowed runs MayDecide for each of who and reports the ones allowed.
func allowed(p *policy.Policy, tool string, tc *schemas.TurnContext, a schemas.Assurance, who []string) map[string]bool {
	out := map[string]bool{}
	for _, w := range who {
		if p.MayDecide(tool, tc, w, a) == nil {
			out[w] = true
		}
	}
	return out
}

func TestDeciderRulePrecedenceMostSpecificRuleReplacesTheOthers(t *testing.T) {
	p := mustParse(t, rules)
	everyone := []string{"cli:alice", "cli:olga", "cli:tina", "cli:sam", "cli:ada", "cli:mallory"}
	tests := []struct {
		name     string
		tool     string
		audience schemas.Audience
		boundary string
		want     []string // exactly these may decide
	}{
		{"no tool or boundary rule: the file rule (requester and ops)", "plain", schemas.AudiencePersonal, "local", []string{"cli:alice", "cli:olga"}},
		{"an unlisted tool also gets the file rule", "unlisted", schemas.AudienceTeam, "local", []string{"cli:alice", "cli:olga"}},
		{"a trust boundary rule replaces the file rule", "plain", schemas.AudiencePersonal, "partner", []string{"cli:tina"}},
		{"a tool rule replaces the file rule", "ruled", schemas.AudiencePersonal, "local", []string{"cli:sam"}},
		{"a tool rule beats a trust boundary rule", "ruled", schemas.AudienceTeam, "partner", []string{"cli:sam"}},
		{"a tool audience rule beats the tool rule", "aud", schemas.AudiencePublic, "local", []string{"cli:ada"}},
		{"a tool audience rule beats a trust boundary rule", "aud", schemas.AudiencePublic, "partner", []string{"cli:ada"}},
		{"another audience falls back to the tool rule (requester default true)", "aud", schemas.AudienceTeam, "local", []string{"cli:alice", "cli:sam"}},
		{"an audience rule alone applies to its audience", "audonly", schemas.AudiencePublic, "local", []string{"cli:ada"}},
		{"an audience rule alone does not apply to other audiences: boundary rule", "audonly", schemas.AudienceTeam, "partner", []string{"cli:tina"}},
		{"an audience rule alone does not apply to other audiences: file rule", "audonly", schemas.AudiencePersonal, "local", []string{"cli:alice", "cli:olga"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := allowed(p, tc.tool, turn(tc.audience, tc.boundary), schemas.AssuranceVerified, everyone)
			want := map[string]bool{}
			for _, w := range tc.want {
				want[w] = true
			}
			for _, w := range everyone {
				if got[w] != want[w] {
					t.Errorf("%s may decide = %v, want %v", w, got[w], want[w])
				}
			}
		})
	}
}

func TestWithoutDeciderRulesOnlyTheRequesterAndApproversDecide(t *testing.T) {
	p := mustParse(t, `{
	  "approvers": ["cli:bob"],
	  "groups": {"ops": ["cli:olga"]},
	  "tools": {"x": {"approval": "required", "approvers": ["cli:carol"]}, "y": {"approval": "required"}}
	}`)
	personal := turn(schemas.AudiencePersonal, "local")
	checkMayDecide(t, p, []decideCase{
		{"the requester", "y", personal, "cli:alice", schemas.AssuranceVerified, true},
		{"a file approver", "y", personal, "cli:bob", schemas.AssuranceVerified, true},
		{"a tool approver for their tool", "x", personal, "cli:carol", schemas.AssuranceVerified, true},
		{"a tool approver for another tool", "y", personal, "cli:carol", schemas.AssuranceVerified, false},
		{"a group member no rule names", "y", personal, "cli:olga", schemas.AssuranceVerified, false},
		{"the requester's id on another transport", "y", personal, "slack:alice", schemas.AssuranceVerified, false},
		{"someone else", "x", personal, "cli:mallory", schemas.AssuranceVerified, false},
	})
}

func TestApproverListsAddPrincipalsToWhicheverRuleApplies(t *testing.T) {
	p := mustParse(t, `{
	  "approvers": ["cli:bob"],
	  "groups": {"ops": ["cli:olga"]},
	  "deciders": {"requester": false, "groups": ["ops"]},
	  "trust_boundary_deciders": {"partner": {"requester": false, "principals": ["cli:tina"]}},
	  "tools": {
	    "x": {"approval": "required", "approvers": ["cli:carol"],
	          "deciders": {"requester": false, "principals": ["cli:dave"]},
	          "audience_deciders": {"public": {"requester": false, "principals": ["cli:ada"], "min_assurance": "strong"}}},
	    "y": {"approval": "required"}
	  }
	}`)
	checkMayDecide(t, p, []decideCase{
		{"a file approver under the file rule", "y", turn(schemas.AudiencePersonal, "local"), "cli:bob", schemas.AssuranceVerified, true},
		{"a file approver under a trust boundary rule", "y", turn(schemas.AudiencePersonal, "partner"), "cli:bob", schemas.AssuranceVerified, true},
		{"a file approver under a tool rule", "x", turn(schemas.AudiencePersonal, "local"), "cli:bob", schemas.AssuranceVerified, true},
		{"a tool approver under its tool rule", "x", turn(schemas.AudienceTeam, "local"), "cli:carol", schemas.AssuranceVerified, true},
		{"a tool approver under its tool audience rule", "x", turn(schemas.AudiencePublic, "local"), "cli:carol", schemas.AssuranceStrong, true},
		{"a tool approver under another tool's rule", "y", turn(schemas.AudiencePersonal, "local"), "cli:carol", schemas.AssuranceVerified, false},
		{"an approver still needs the rule's assurance", "x", turn(schemas.AudiencePublic, "local"), "cli:bob", schemas.AssuranceVerified, false},
		{"an approver is never allowed unverified", "y", turn(schemas.AudiencePersonal, "local"), "cli:bob", schemas.AssuranceNone, false},
		{"the requester of a requester:false rule", "y", turn(schemas.AudiencePersonal, "local"), "cli:alice", schemas.AssuranceStrong, false},
	})
}

func TestGroupsAndRequesterFlag(t *testing.T) {
	p := mustParse(t, `{
	  "groups": {"ops": ["cli:olga", "slack:U-OSCAR"], "sec": ["cli:sam"]},
	  "tools": {
	    "both":    {"approval": "required", "deciders": {"groups": ["ops", "sec"]}},
	    "mixed":   {"approval": "required", "deciders": {"requester": false, "principals": ["cli:bob"], "groups": ["sec"]}},
	    "explicit":{"approval": "required", "deciders": {"requester": true, "groups": ["sec"]}}
	  }
	}`)
	tc := turn(schemas.AudiencePersonal, "local")
	checkMayDecide(t, p, []decideCase{
		{"a member of the first group", "both", tc, "cli:olga", schemas.AssuranceVerified, true},
		{"a member on another transport", "both", tc, "slack:U-OSCAR", schemas.AssuranceVerified, true},
		{"a member of the second group", "both", tc, "cli:sam", schemas.AssuranceVerified, true},
		{"a member's id on another transport", "both", tc, "slack:olga", schemas.AssuranceVerified, false},
		{"the requester by default", "both", tc, "cli:alice", schemas.AssuranceVerified, true},
		{"the requester when the rule says requester true", "explicit", tc, "cli:alice", schemas.AssuranceVerified, true},
		{"the requester when the rule says requester false", "mixed", tc, "cli:alice", schemas.AssuranceVerified, false},
		{"a named principal next to a group", "mixed", tc, "cli:bob", schemas.AssuranceVerified, true},
		{"a group member next to a named principal", "mixed", tc, "cli:sam", schemas.AssuranceVerified, true},
		{"a member of a group the rule does not name", "mixed", tc, "cli:olga", schemas.AssuranceVerified, false},
		{"a group's name is not a principal", "both", tc, "ops", schemas.AssuranceVerified, false},
	})
	// The requester flag is about the requester only: a requester who is
	// also a named principal is still allowed as that principal.
	self := mustParse(t, `{"tools": {"x": {"approval": "required", "deciders": {"requester": false, "principals": ["cli:alice"]}}}}`)
	if err := self.MayDecide("x", tc, "cli:alice", schemas.AssuranceVerified); err != nil {
		t.Fatalf("a requester named as a principal: %v", err)
	}
}

func TestMinimumAssurance(t *testing.T) {
	p := mustParse(t, `{
	  "groups": {"ops": ["cli:olga"]},
	  "tools": {
	    "strong":   {"approval": "required", "deciders": {"groups": ["ops"], "min_assurance": "strong"}},
	    "verified": {"approval": "required", "deciders": {"groups": ["ops"], "min_assurance": "verified"}},
	    "default":  {"approval": "required", "deciders": {"groups": ["ops"]}},
	    "builtin":  {"approval": "required"}
	  }
	}`)
	tc := turn(schemas.AudiencePersonal, "local")
	levels := []struct {
		name string
		a    schemas.Assurance
	}{{"unverified", schemas.AssuranceNone}, {"verified", schemas.AssuranceVerified}, {"strong", schemas.AssuranceStrong}}
	tests := []struct {
		tool      string
		principal string
		want      []bool // per level: none, verified, strong
	}{
		{"strong", "cli:olga", []bool{false, false, true}},
		{"strong", "cli:alice", []bool{false, false, true}},
		{"verified", "cli:olga", []bool{false, true, true}},
		{"default", "cli:olga", []bool{false, true, true}},
		{"default", "cli:alice", []bool{false, true, true}},
		{"builtin", "cli:alice", []bool{false, true, true}},
		{"strong", "cli:mallory", []bool{false, false, false}},
	}
	for _, tc2 := range tests {
		for i, l := range levels {
			t.Run(tc2.tool+" rule, "+tc2.principal+" "+l.name, func(t *testing.T) {
				err := p.MayDecide(tc2.tool, tc, tc2.principal, l.a)
				if got := err == nil; got != tc2.want[i] {
					t.Fatalf("MayDecide = %v, want allowed=%v", err, tc2.want[i])
				}
			})
		}
	}
	// An assurance below "none" (a zero value misread, a negative number)
	// is never enough either.
	if err := p.MayDecide("builtin", tc, "cli:alice", schemas.Assurance(-1)); err == nil {
		t.Fatal("a negative assurance was accepted")
	}
	// Sender.Assurance: Strong counts only with Verified.
	for _, s := range []struct {
		sender schemas.Sender
		want   schemas.Assurance
	}{
		{schemas.Sender{}, schemas.AssuranceNone},
		{schemas.Sender{Strong: true}, schemas.AssuranceNone},
		{schemas.Sender{Verified: true}, schemas.AssuranceVerified},
		{schemas.Sender{Verified: true, Strong: true}, schemas.AssuranceStrong},
	} {
		if got := s.sender.Assurance(); got != s.want {
			t.Errorf("%+v.Assurance() = %d, want %d", s.sender, got, s.want)
		}
	}
}

func TestMayDecideNeedsAContextAndAPrincipal(t *testing.T) {
	p := mustParse(t, rules)
	if err := p.MayDecide("plain", nil, "cli:olga", schemas.AssuranceStrong); err == nil {
		t.Fatal("no persisted context, yet a group member may decide")
	}
	if err := p.MayDecide("plain", turn(schemas.AudiencePersonal, "local"), "", schemas.AssuranceStrong); err == nil {
		t.Fatal("an empty principal may decide")
	}
	// A context whose requester principal is empty does not make an empty
	// principal the requester.
	empty := turn(schemas.AudiencePersonal, "local")
	empty.Requester.Principal = ""
	if err := p.MayDecide("plain", empty, "", schemas.AssuranceStrong); err == nil {
		t.Fatal("an empty principal matched an empty requester")
	}
	// The refusal says why.
	err := p.MayDecide("ruled", turn(schemas.AudiencePersonal, "local"), "cli:mallory", schemas.AssuranceVerified)
	if err == nil || !strings.Contains(err.Error(), "cli:mallory") {
		t.Fatalf("refusal %v does not name the principal", err)
	}
}

func TestQuorum(t *testing.T) {
	p := mustParse(t, `{
	  "groups": {"ops": ["cli:olga", "cli:oscar", "cli:otto"]},
	  "deciders": {"groups": ["ops"], "quorum": 3},
	  "trust_boundary_deciders": {"partner": {"groups": ["ops"], "quorum": 2}},
	  "tools": {
	    "one":  {"approval": "required", "deciders": {"groups": ["ops"]}},
	    "four": {"approval": "required", "deciders": {"groups": ["ops"], "quorum": 4},
	             "audience_deciders": {"public": {"groups": ["ops"], "quorum": 1}}},
	    "plain":{"approval": "required"}
	  }
	}`)
	tests := []struct {
		name string
		p    *policy.Policy
		tool string
		tc   *schemas.TurnContext
		want int
	}{
		{"no rules at all", mustParse(t, `{}`), "x", turn(schemas.AudiencePersonal, "local"), 1},
		{"the built-in policy", policy.Default(), "write_file", turn(schemas.AudiencePersonal, "local"), 1},
		{"a rule without a quorum", p, "one", turn(schemas.AudiencePersonal, "local"), 1},
		{"the file rule's quorum", p, "plain", turn(schemas.AudiencePersonal, "local"), 3},
		{"a trust boundary rule's quorum replaces the file's", p, "plain", turn(schemas.AudiencePersonal, "partner"), 2},
		{"a tool rule's quorum replaces the boundary's", p, "four", turn(schemas.AudienceTeam, "partner"), 4},
		{"an audience rule's quorum replaces the tool's", p, "four", turn(schemas.AudiencePublic, "local"), 1},
		{"a tool rule without a quorum does not inherit the file's", p, "one", turn(schemas.AudienceTeam, "partner"), 1},
		{"no persisted context", p, "plain", nil, 1},
		{"an explicit quorum of 0 means 1", mustParse(t, `{"deciders": {"quorum": 0}}`), "x", turn(schemas.AudiencePersonal, "local"), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Quorum(tc.tool, tc.tc); got != tc.want {
				t.Fatalf("Quorum = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestParseRejectsBadDeciderRulesAndSessions(t *testing.T) {
	tests := []struct {
		name string
		json string
		want string // substring of the error
	}{
		{"a file rule naming an unknown group", `{"deciders": {"groups": ["ops"]}}`, "unknown group"},
		{"a tool rule naming an unknown group", `{"groups": {"ops": ["cli:o"]}, "tools": {"x": {"approval": "required", "deciders": {"groups": ["opps"]}}}}`, "unknown group"},
		{"an audience rule naming an unknown group", `{"tools": {"x": {"approval": "required", "audience_deciders": {"team": {"groups": ["ops"]}}}}}`, "unknown group"},
		{"a boundary rule naming an unknown group", `{"trust_boundary_deciders": {"partner": {"groups": ["ops"]}}}`, "unknown group"},
		{"an empty group", `{"groups": {"ops": []}}`, "empty"},
		{"a group member without a transport", `{"groups": {"ops": ["olga"]}}`, "principal"},
		{"a group member with an empty id", `{"groups": {"ops": ["cli:"]}}`, "principal"},
		{"a rule principal without a transport", `{"deciders": {"principals": ["bob"]}}`, "principal"},
		{"a rule principal with an empty transport", `{"tools": {"x": {"approval": "required", "deciders": {"principals": [":bob"]}}}}`, "principal"},
		{"an audience rule principal without a transport", `{"tools": {"x": {"approval": "required", "audience_deciders": {"public": {"principals": ["bob"]}}}}}`, "principal"},
		{"min_assurance none", `{"deciders": {"min_assurance": "none"}}`, "min_assurance"},
		{"min_assurance unverified", `{"deciders": {"min_assurance": "unverified"}}`, "min_assurance"},
		{"min_assurance in another case", `{"deciders": {"min_assurance": "Strong"}}`, "min_assurance"},
		{"min_assurance that is not a level", `{"trust_boundary_deciders": {"x": {"min_assurance": "mfa"}}}`, "min_assurance"},
		{"a negative quorum", `{"deciders": {"quorum": -1}}`, "quorum"},
		{"a quorum above 16", `{"tools": {"x": {"approval": "required", "deciders": {"quorum": 17}}}}`, "quorum"},
		{"a quorum more than the people who could decide", `{"tools": {"x": {"approval": "required", "deciders": {"requester": false, "principals": ["cli:bob"], "quorum": 2}}}}`, "at most 1 people"},
		{"a file rule nobody may satisfy", `{"deciders": {"requester": false}}`, "nobody"},
		{"a boundary rule nobody may satisfy", `{"trust_boundary_deciders": {"partner": {"requester": false}}}`, "nobody"},
		{"a tool rule nobody may satisfy", `{"tools": {"x": {"approval": "required", "deciders": {"requester": false, "quorum": 1}}}}`, "nobody"},
		{"an audience rule nobody may satisfy", `{"tools": {"x": {"approval": "required", "audience_deciders": {"team": {"requester": false}}}}}`, "nobody"},
		{"an unknown audience in audience_deciders", `{"tools": {"x": {"approval": "required", "audience_deciders": {"everyone": {}}}}}`, "unknown audience"},
		{"a null audience rule", `{"tools": {"x": {"approval": "required", "audience_deciders": {"team": null}}}}`, "null"},
		{"a null boundary rule", `{"trust_boundary_deciders": {"partner": null}}`, "null"},
		{"an unknown field in a decider rule", `{"deciders": {"quorom": 2}}`, "unknown field"},
		{"groups that are not lists", `{"groups": {"ops": "cli:olga"}}`, "parse policy"},
		{"an invalid sessions.busy", `{"sessions": {"busy": "drop"}}`, "sessions.busy"},
		{"sessions.busy in another case", `{"sessions": {"busy": "Queue"}}`, "sessions.busy"},
		{"an invalid busy mode for a transport", `{"sessions": {"transports": {"slack": "drop"}}}`, "sessions.transports.slack"},
		{"an empty busy mode for a transport", `{"sessions": {"transports": {"slack": ""}}}`, "sessions.transports.slack"},
		{"an unknown field in sessions", `{"sessions": {"bussy": "queue"}}`, "unknown field"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse([]byte(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, %v; want an error mentioning %q", p, err, tc.want)
			}
		})
	}
}

func TestParseAcceptsValidDeciderRules(t *testing.T) {
	tests := []struct {
		name string
		json string
	}{
		{"the requester alone, by an empty rule", `{"deciders": {}}`},
		{"requester false with a principal", `{"deciders": {"requester": false, "principals": ["cli:bob"]}}`},
		{"requester false with a group", `{"groups": {"ops": ["cli:o"]}, "deciders": {"requester": false, "groups": ["ops"]}}`},
		{"both assurance levels", `{"deciders": {"min_assurance": "verified"}, "trust_boundary_deciders": {"x": {"min_assurance": "strong"}}}`},
		{"quorum bounds", `{"groups": {"g": ["a:1","a:2","a:3","a:4","a:5","a:6","a:7","a:8","a:9","a:10","a:11","a:12","a:13","a:14","a:15"]}, "deciders": {"groups": ["g"], "quorum": 16}, "trust_boundary_deciders": {"x": {"quorum": 1}, "y": {"quorum": 0}}}`},
		{"a principal whose id holds a colon", `{"deciders": {"principals": ["matrix:@bob:example.org"]}}`},
		{"every audience", `{"tools": {"x": {"approval": "required", "audience_deciders": {"personal": {}, "team": {}, "public": {}}}}}`},
		{"both busy modes", `{"sessions": {"busy": "supersede", "transports": {"slack": "queue", "cli": "supersede"}}}`},
		{"an empty sessions object", `{"sessions": {}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := policy.Parse([]byte(tc.json)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
		})
	}
}

func TestBusy(t *testing.T) {
	tests := []struct {
		name      string
		p         *policy.Policy
		transport string
		want      string
	}{
		{"no sessions rule queues", mustParse(t, `{}`), "slack", policy.BusyQueue},
		{"the built-in policy queues", policy.Default(), "cli", policy.BusyQueue},
		{"an empty sessions rule queues", mustParse(t, `{"sessions": {}}`), "slack", policy.BusyQueue},
		{"the file's busy mode", mustParse(t, `{"sessions": {"busy": "supersede"}}`), "slack", policy.BusySupersede},
		{"a transport's own mode beats the file's", mustParse(t, `{"sessions": {"busy": "supersede", "transports": {"slack": "queue"}}}`), "slack", policy.BusyQueue},
		{"another transport gets the file's", mustParse(t, `{"sessions": {"busy": "supersede", "transports": {"slack": "queue"}}}`), "cli", policy.BusySupersede},
		{"a transport's mode without a file mode", mustParse(t, `{"sessions": {"transports": {"slack": "supersede"}}}`), "slack", policy.BusySupersede},
		{"another transport without a file mode queues", mustParse(t, `{"sessions": {"transports": {"slack": "supersede"}}}`), "discord", policy.BusyQueue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Busy(tc.transport); got != tc.want {
				t.Fatalf("Busy(%s) = %q, want %q", tc.transport, got, tc.want)
			}
		})
	}
}

// decideCase is one MayDecide question and whether the answer is yes.
type decideCase struct {
	name      string
	tool      string
	tc        *schemas.TurnContext
	principal string
	a         schemas.Assurance
	want      bool
}

func checkMayDecide(t *testing.T, p *policy.Policy, cases []decideCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := p.MayDecide(c.tool, c.tc, c.principal, c.a)
			if got := err == nil; got != c.want {
				t.Fatalf("MayDecide(%s, %s, assurance %d) = %v, want allowed=%v", c.tool, c.principal, c.a, err, c.want)
			}
		})
	}
}

func TestAutomationNeverDecidesItsOwnTurn(t *testing.T) {
	p := mustParse(t, `{
	  "approvers": ["cli:bot", "cli:alice"],
	  "groups": {"robots": ["cli:bot"]},
	  "tools": {
	    "x": {"approval": "required", "approvers": ["cli:bot"]},
	    "y": {"approval": "required", "deciders": {"requester": true, "principals": ["cli:bot"], "groups": ["robots"]}},
	    "z": {"approval": "required"}
	  }
	}`)
	of := func(kind schemas.SenderKind) *schemas.TurnContext {
		tc := turn(schemas.AudiencePersonal, "local")
		tc.Requester = schemas.Requester{Principal: "cli:bot", SenderID: "bot", Kind: kind, Verified: true}
		return tc
	}
	var cases []decideCase
	for _, kind := range []schemas.SenderKind{schemas.SenderService, schemas.SenderBot, ""} {
		for _, tool := range []string{"x", "y", "z"} {
			cases = append(cases, decideCase{fmt.Sprintf("a %q requester on %s", kind, tool), tool, of(kind), "cli:bot", schemas.AssuranceStrong, false})
		}
		cases = append(cases, decideCase{fmt.Sprintf("a person deciding a %q requester's turn", kind), "z", of(kind), "cli:alice", schemas.AssuranceVerified, true})
	}
	// The same principal as a person's requester is allowed by the same
	// rules: only the requester's kind refuses it.
	for _, tool := range []string{"x", "y", "z"} {
		cases = append(cases, decideCase{"a user requester on " + tool, tool, of(schemas.SenderUser), "cli:bot", schemas.AssuranceVerified, true})
	}
	checkMayDecide(t, p, cases)
	if err := p.MayDecide("y", of(schemas.SenderService), "cli:bot", schemas.AssuranceStrong); err == nil || !strings.Contains(err.Error(), "never decides its own turn") {
		t.Fatalf("error %v, want one saying the requester never decides its own turn", err)
	}
}
