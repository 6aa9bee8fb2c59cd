package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

func TestPathUnder(t *testing.T) {
	cases := []struct {
		path, prefix string
		want         bool
	}{
		{"notes/a.txt", "notes/", true},
		{"notes/sub/a.txt", "notes/", true},
		{"./notes/a.txt", "notes/", true},
		{"notes//a.txt", "notes/", true},
		{"notes/../x", "notes/", false},
		{"notes/x/../../etc", "notes/", false},
		{"../etc", "notes/", false},
		{"../notes/a", "notes/", false},
		{"notes", "notes/", false},
		{"notes2/a.txt", "notes/", false},
		{"/notes/a.txt", "notes/", false},
		{"notes/a.txt", "/notes/", false},
		{"/srv/data/a", "/srv/data/", true},
		{"/srv/data/../x", "/srv/data/", false},
		{"notes\\..\\x", "notes/", false},
		{"notes/a\x00", "notes/", false},
		{"", "notes/", false},
		{"notes/a.txt", "notes", false},
		{"a", "/", false},
	}
	for _, c := range cases {
		if got := policy.PathUnder(c.path, c.prefix); got != c.want {
			t.Errorf("PathUnder(%q, %q) = %v, want %v", c.path, c.prefix, got, c.want)
		}
	}
}

func TestPathPrefixOf(t *testing.T) {
	cases := []struct {
		path, want string
		ok         bool
	}{
		{"notes/a.txt", "notes/", true},
		{"notes/sub/a.txt", "notes/sub/", true},
		{"/srv/x/y", "/srv/x/", true},
		{"./notes/a.txt", "notes/", true},
		{"a.txt", "", false},
		{"/a.txt", "", false},
		{"../etc/passwd", "", false},
		{"notes/../x/a", "", false},
		{"", "", false},
	}
	for _, c := range cases {
		got, ok := policy.PathPrefixOf(c.path)
		if got != c.want || ok != c.ok {
			t.Errorf("PathPrefixOf(%q) = %q, %v; want %q, %v", c.path, got, ok, c.want, c.ok)
		}
	}
}

func TestGrantRulesAreValidated(t *testing.T) {
	for name, grants := range map[string]string{
		"option without a prefix":     `[{"option": "forever", "scope": "session"}]`,
		"bare approve":                `[{"option": "approve", "scope": "session"}]`,
		"unknown scope":               `[{"option": "approve-x", "scope": "everyone"}]`,
		"never expires":               `[{"option": "approve-x", "scope": "session", "for": "none"}]`,
		"values without a field":      `[{"option": "approve-x", "scope": "session", "values": ["a"]}]`,
		"the same option twice":       `[{"option": "approve-x", "scope": "session"}, {"option": "approve-x", "scope": "requester"}]`,
		"unknown key (typo widening)": `[{"option": "approve-x", "scope": "session", "path_prefx": "path"}]`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := policy.Parse([]byte(`{"tools": {"t": {"approval": "required", "grants": ` + grants + `}}}`))
			if err == nil {
				t.Fatal("parsed")
			}
		})
	}
	if _, err := policy.Parse([]byte(`{"tools": {"t": {"approval": "required", "options": ["approve-x"]}}}`)); err == nil {
		t.Fatal("a grant option in options parsed")
	}
}

func grantTC() *schemas.TurnContext {
	return &schemas.TurnContext{V: 1, SessionID: "s1", TurnID: "t-1", Transport: "cli", Audience: schemas.AudiencePersonal, TrustBoundary: "local",
		Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
		Channel:   schemas.Channel{ID: "dm", Kind: schemas.ChannelDM}}
}

func TestGrantOffers(t *testing.T) {
	p, err := policy.Parse([]byte(`{"version": "v1", "tools": {
	  "write_file": {"approval": "required", "grants": [
	    {"option": "approve-session", "scope": "session", "for": "2h"},
	    {"option": "approve-folder", "scope": "requester", "path_prefix": "path"},
	    {"option": "deny-repo", "scope": "requester", "field": "repo", "values": ["a", "b"]}
	  ]},
	  "vote": {"approval": "required", "deciders": {"principals": ["cli:x", "cli:y"], "quorum": 2}, "grants": [
	    {"option": "approve-session", "scope": "session"},
	    {"option": "approve-q", "scope": "session", "allow_quorum": true}
	  ]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	tc := grantTC()
	names := func(os []schemas.GrantOffer) (s []string) {
		for _, o := range os {
			s = append(s, o.Option)
		}
		return s
	}
	got := p.GrantOffers("write_file", tc, `{"path":"notes/a.txt","repo":"a"}`)
	if strings.Join(names(got), ",") != "approve-session,approve-folder,deny-repo" {
		t.Fatalf("offers %v", names(got))
	}
	if o := got[0]; o.Scope.Kind != schemas.GrantScopeSession || o.Scope.SessionID != "s1" || o.For != 2*time.Hour || o.Effect != schemas.ApprovalApproved {
		t.Errorf("session offer %+v", o)
	}
	if o := got[1]; o.Scope.PathPrefix != "notes/" || o.Scope.PathField != "path" || o.For != policy.DefaultGrantFor || !strings.Contains(o.Summary, "path is under notes/") {
		t.Errorf("folder offer %+v", o)
	}
	if o := got[2]; o.Effect != schemas.ApprovalDenied || o.Scope.ValueField != "repo" || strings.Join(o.Scope.Values, ",") != "a,b" {
		t.Errorf("repo offer %+v", o)
	}
	// Not derivable: no folder for ../x or a top-level file, no repo outside the set.
	if got := names(p.GrantOffers("write_file", tc, `{"path":"../x/a","repo":"c"}`)); strings.Join(got, ",") != "approve-session" {
		t.Errorf("offers %v", got)
	}
	if got := names(p.GrantOffers("vote", tc, `{}`)); strings.Join(got, ",") != "approve-q" {
		t.Errorf("quorum offers %v", got)
	}
}

func TestStillGrants(t *testing.T) {
	v1 := `{"version": "v1", "tools": {"t": {"approval": "required", "grants": [{"option": "approve-s", "scope": "session", "for": "24h"}]}}}`
	p1, _ := policy.Parse([]byte(v1))
	tc := grantTC()
	now := time.Now().UTC()
	g := &schemas.Grant{GrantID: "g-1", Option: "approve-s", Effect: schemas.ApprovalApproved, Tool: "t",
		Scope: schemas.GrantScope{Kind: schemas.GrantScopeSession, SessionID: "s1"}, Principal: "cli:alice",
		Assurance: schemas.AssuranceVerified, Context: tc, PolicyVersion: "v1", CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)}
	if until, err := p1.StillGrants(g); err != nil || !until.Equal(g.ExpiresAt) {
		t.Fatalf("v1: %v %v", until, err)
	}
	for name, v2 := range map[string]string{
		"option removed":     `{"version": "v2", "tools": {"t": {"approval": "required"}}}`,
		"scope changed":      `{"version": "v2", "tools": {"t": {"approval": "required", "grants": [{"option": "approve-s", "scope": "requester"}]}}}`,
		"pattern added":      `{"version": "v2", "tools": {"t": {"approval": "required", "grants": [{"option": "approve-s", "scope": "session", "path_prefix": "p"}]}}}`,
		"principal excluded": `{"version": "v2", "tools": {"t": {"approval": "required", "deciders": {"requester": false, "principals": ["cli:bob"]}, "grants": [{"option": "approve-s", "scope": "session"}]}}}`,
		"quorum now needed":  `{"version": "v2", "tools": {"t": {"approval": "required", "deciders": {"principals": ["cli:bob"], "quorum": 2}, "grants": [{"option": "approve-s", "scope": "session"}]}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			p2, err := policy.Parse([]byte(v2))
			if err != nil {
				t.Fatal(err)
			}
			_, err = p2.StillGrants(g)
			if schemas.CodeOf(err) != schemas.CodeGrantRevoked || !strings.Contains(err.Error(), "policy v2") {
				t.Fatalf("StillGrants: %v", err)
			}
		})
	}
	p3, _ := policy.Parse([]byte(`{"version": "v3", "tools": {"t": {"approval": "required", "grants": [{"option": "approve-s", "scope": "session", "for": "1h"}]}}}`))
	if until, err := p3.StillGrants(g); err != nil || !until.Equal(now.Add(time.Hour)) {
		t.Fatalf("a shortened for: %v %v", until, err)
	}
}
