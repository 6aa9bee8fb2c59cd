package policy_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const full = `{
  "version": "v7",
  "default_approval": "deny",
  "approvers": ["slack:U-SEC"],
  "expires_after": "2h",
  "tools": {
    "echo":       {"approval": "never"},
    "write_file": {"approval": "required", "audiences": {"public": "deny", "personal": "never"}, "approvers": ["slack:U-OPS"], "expires_after": "30m"},
    "deploy":     {"approval": "required", "options": ["approve"], "expires_after": "none"},
    "lookup":     {"approval": "required"}
  },
  "transports": {
    "slack":   {"trust_boundary": "acme", "interactive": true},
    "webhook": {"trust_boundary": "external", "interactive": false}
  },
  "default_transport": {"trust_boundary": "unknown", "interactive": false}
}`

func mustParse(t testing.TB, s string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(s))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return p
}

func TestParseRejectsPoliciesThatCouldSilentlyWeakenARule(t *testing.T) {
	tests := []struct {
		name string
		json string
		want string // substring of the error
	}{
		{"an unknown top-level field", `{"default_aproval": "never"}`, "unknown field"},
		{"an unknown tool field", `{"tools": {"echo": {"approval": "never", "aprovers": ["x"]}}}`, "unknown field"},
		{"an unknown transport field", `{"transports": {"cli": {"trust_boundary": "local", "interactve": true}}}`, "unknown field"},
		{"a bad default mode", `{"default_approval": "sometimes"}`, "default_approval"},
		{"a bad tool mode", `{"tools": {"echo": {"approval": "maybe"}}}`, "approval"},
		{"a tool without a mode", `{"tools": {"echo": {}}}`, "approval"},
		{"a bad audience mode", `{"tools": {"echo": {"approval": "never", "audiences": {"public": "nope"}}}}`, "audience"},
		{"an unknown audience", `{"tools": {"echo": {"approval": "never", "audiences": {"everyone": "deny"}}}}`, "audience"},
		{"an unknown option", `{"tools": {"echo": {"approval": "required", "options": ["approve", "escalate"]}}}`, "option"},
		{"an option with different case", `{"tools": {"echo": {"approval": "required", "options": ["Approve"]}}}`, "option"},
		{"a tool name no call could match", `{"tools": {"Write_File": {"approval": "never"}}}`, "tool name"},
		{"a pattern of every tool", `{"tools": {"*": {"approval": "never"}}}`, "tool name"},
		{"a pattern with a wildcard inside a name", `{"tools": {"git*": {"approval": "never"}}}`, "tool name"},
		{"a pattern with a wildcard before the dot", `{"tools": {"*.read": {"approval": "never"}}}`, "tool name"},
		{"a pattern whose prefix ends in a dot", `{"tools": {"github..*": {"approval": "never"}}}`, "tool name"},
		{"a pattern with a subject wildcard", `{"tools": {"github.>": {"approval": "never"}}}`, "tool name"},
		{"a pattern with an upper-case prefix", `{"tools": {"GitHub.*": {"approval": "never"}}}`, "tool name"},
		{"a transport without a trust boundary", `{"transports": {"cli": {"interactive": true}}}`, "trust_boundary"},
		{"a default transport without a trust boundary", `{"default_transport": {"interactive": true}}`, "trust_boundary"},
		{"a zero expiry", `{"expires_after": "0s"}`, "duration"},
		{"a negative expiry", `{"tools": {"echo": {"approval": "required", "expires_after": "-1h"}}}`, "duration"},
		{"an expiry that is not a string", `{"expires_after": 3600}`, "duration"},
		{"an expiry that is not a duration", `{"expires_after": "tomorrow"}`, "duration"},
		{"trailing data after the object", `{"default_approval": "never"} {"default_approval": "deny"}`, "trailing"},
		{"not JSON", `default_approval: never`, "parse policy"},
		{"an empty file", ``, "parse policy"},
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

func TestModeFor(t *testing.T) {
	p := mustParse(t, full)
	d := policy.Default()
	tests := []struct {
		name     string
		p        *policy.Policy
		tool     string
		audience schemas.Audience
		want     policy.Mode
	}{
		{"a free tool", p, "echo", schemas.AudiencePublic, policy.ModeNever},
		{"a tool's audience override denies", p, "write_file", schemas.AudiencePublic, policy.ModeDeny},
		{"a tool's audience override relaxes", p, "write_file", schemas.AudiencePersonal, policy.ModeNever},
		{"an audience without an override uses the tool's mode", p, "write_file", schemas.AudienceTeam, policy.ModeRequired},
		{"an unlisted tool gets the default mode", p, "rm", schemas.AudienceTeam, policy.ModeDeny},
		{"default policy: echo is free", d, "echo", schemas.AudiencePublic, policy.ModeNever},
		{"default policy: write_file in a DM needs approval", d, "write_file", schemas.AudiencePersonal, policy.ModeRequired},
		{"default policy: write_file in a team needs approval", d, "write_file", schemas.AudienceTeam, policy.ModeRequired},
		{"default policy: write_file in public is denied", d, "write_file", schemas.AudiencePublic, policy.ModeDeny},
		{"default policy: an unknown tool needs approval", d, "send_email", schemas.AudiencePersonal, policy.ModeRequired},
		{"a missing default_approval means required", mustParse(t, `{}`), "anything", schemas.AudiencePersonal, policy.ModeRequired},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.ModeFor(tc.tool, tc.audience, tools.Hints{}); got != tc.want {
				t.Fatalf("ModeFor(%s, %s) = %s, want %s", tc.tool, tc.audience, got, tc.want)
			}
		})
	}
}

func TestOptionsAndExpiry(t *testing.T) {
	p := mustParse(t, full)
	tests := []struct {
		name    string
		p       *policy.Policy
		tool    string
		options []string
		expiry  time.Duration
	}{
		{"a tool with its own options and no expiry", p, "deploy", []string{"approve"}, 0},
		{"a tool with its own expiry", p, "write_file", []string{"approve", "deny"}, 30 * time.Minute},
		{"a tool using the file's expiry", p, "lookup", []string{"approve", "deny"}, 2 * time.Hour},
		{"an unlisted tool using the file's expiry", p, "rm", []string{"approve", "deny"}, 2 * time.Hour},
		{"default policy: write_file expires after a day", policy.Default(), "write_file", []string{"approve", "deny"}, 24 * time.Hour},
		{"default policy: others expire after the built-in default", policy.Default(), "other", []string{"approve", "deny"}, policy.DefaultExpiry},
		{"a file-wide none", mustParse(t, `{"expires_after": "none"}`), "x", []string{"approve", "deny"}, 0},
		{"a tool's expiry overrides a file-wide none", mustParse(t, `{"expires_after": "none", "tools": {"x": {"approval": "required", "expires_after": "5m"}}}`), "x", []string{"approve", "deny"}, 5 * time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Options(tc.tool); !slices.Equal(got, tc.options) {
				t.Fatalf("Options = %v, want %v", got, tc.options)
			}
			if got := tc.p.ExpiresAfter(tc.tool); got != tc.expiry {
				t.Fatalf("ExpiresAfter = %v, want %v", got, tc.expiry)
			}
		})
	}
	// Options returns a copy: a caller cannot change the policy.
	o := p.Options("deploy")
	o[0] = "deny"
	if got := p.Options("deploy"); got[0] != "approve" {
		t.Fatalf("policy changed through a returned slice: %v", got)
	}
}

func TestMayDecide(t *testing.T) {
	p := mustParse(t, full)
	tc := &schemas.TurnContext{TurnID: "t-1", Requester: schemas.Requester{Principal: "slack:U-ADA", SenderID: "U-ADA", Kind: schemas.SenderUser}}
	tests := []struct {
		name      string
		tool      string
		ctx       *schemas.TurnContext
		principal string
		want      bool
	}{
		{"the requester", "lookup", tc, "slack:U-ADA", true},
		{"the requester's id on another transport", "lookup", tc, "cli:U-ADA", false},
		{"a bare sender id", "lookup", tc, "U-ADA", false},
		{"a global approver", "lookup", tc, "slack:U-SEC", true},
		{"a tool approver for their tool", "write_file", tc, "slack:U-OPS", true},
		{"a tool approver for another tool", "lookup", tc, "slack:U-OPS", false},
		{"someone else", "write_file", tc, "slack:U-MALLORY", false},
		{"an empty principal", "lookup", tc, "", false},
		{"no persisted context", "lookup", nil, "slack:U-ADA", false},
		{"no persisted context, even for a global approver", "lookup", nil, "slack:U-SEC", false},
		{"a context with an empty requester and an empty principal", "lookup", &schemas.TurnContext{}, "", false},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			if got := p.MayDecide(c.tool, c.ctx, c.principal, schemas.AssuranceVerified) == nil; got != c.want {
				t.Fatalf("MayDecide(%s, %s) = %v, want %v", c.tool, c.principal, got, c.want)
			}
		})
	}
}

func TestTransportRules(t *testing.T) {
	p := mustParse(t, full)
	d := policy.Default()
	bare := mustParse(t, `{}`)
	tests := []struct {
		name string
		p    *policy.Policy
		tr   string
		want policy.TransportRule
	}{
		{"a listed interactive transport", p, "slack", policy.TransportRule{TrustBoundary: "acme", Interactive: true}},
		{"a listed non-interactive transport", p, "webhook", policy.TransportRule{TrustBoundary: "external"}},
		{"an unlisted transport gets the file's default", p, "teams", policy.TransportRule{TrustBoundary: "unknown"}},
		{"default policy: cli is local and interactive", d, "cli", policy.TransportRule{TrustBoundary: "local", Interactive: true}},
		{"default policy: webhook is external and not interactive", d, "webhook", policy.TransportRule{TrustBoundary: "external"}},
		{"default policy: others are external and interactive", d, "discord", policy.TransportRule{TrustBoundary: "external", Interactive: true}},
		{"no rules at all: external and interactive", bare, "cli", policy.TransportRule{TrustBoundary: "external", Interactive: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Transport(tc.tr); got != tc.want {
				t.Fatalf("Transport(%s) = %+v, want %+v", tc.tr, got, tc.want)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	if v := mustParse(t, full).Version(); v != "v7" {
		t.Fatalf("version %q", v)
	}
	if v := policy.Default().Version(); v != "builtin-1" {
		t.Fatalf("default version %q", v)
	}
	a, b := mustParse(t, `{"default_approval": "never"}`), mustParse(t, `{"default_approval": "deny"}`)
	if !strings.HasPrefix(a.Version(), "sha256:") || a.Version() == b.Version() {
		t.Fatalf("unversioned policies %q and %q: want distinct digests", a.Version(), b.Version())
	}
	if again := mustParse(t, `{"default_approval": "never"}`); again.Version() != a.Version() {
		t.Fatal("the same file gave two versions")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(good, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"tools": {"echo": {"approval": "often"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		version string
		errHas  string
	}{
		{"no path is the built-in policy", "", "builtin-1", ""},
		{"a valid file", good, "v7", ""},
		{"an invalid file names the file", bad, "", "bad.json"},
		{"a missing file", filepath.Join(dir, "missing.json"), "", "load policy"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Load(tc.path)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("Load = %v, want an error mentioning %q", err, tc.errHas)
				}
				return
			}
			if err != nil || p.Version() != tc.version {
				t.Fatalf("Load = %v %v, want version %s", p, err, tc.version)
			}
		})
	}
}

func BenchmarkModeFor(b *testing.B) {
	p := mustParse(b, full)
	b.ReportAllocs()
	for b.Loop() {
		_ = p.ModeFor("write_file", schemas.AudienceTeam, tools.Hints{})
	}
}

func BenchmarkMayDecide(b *testing.B) {
	p := mustParse(b, full)
	tc := &schemas.TurnContext{Requester: schemas.Requester{Principal: "slack:U-ADA"}}
	b.ReportAllocs()
	for b.Loop() {
		_ = p.MayDecide("write_file", tc, "slack:U-OPS", schemas.AssuranceVerified)
	}
}

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := policy.Parse([]byte(full)); err != nil {
			b.Fatal(err)
		}
	}
}

func TestValidToolName(t *testing.T) {
	tests := []struct {
		name string
		tool string
		want bool
	}{
		{"a lower-case word", "echo", true},
		{"digits, dots, dashes and underscores", "mail.send-v2_0", true},
		{"the longest name, 64 bytes", strings.Repeat("a", 64), true},
		{"one byte too long", strings.Repeat("a", 65), false},
		{"the empty name", "", false},
		{"a space", "Bad Tool", false},
		{"an upper-case letter", "Echo", false},
		{"a path", "echo/../x", false},
		{"a subject wildcard", "echo.>", false},
		{"a non-ASCII letter", "écho", false},
		{"a control character", "echo\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := policy.ValidToolName(tc.tool); got != tc.want {
				t.Fatalf("ValidToolName(%q) = %v, want %v", tc.tool, got, tc.want)
			}
		})
	}
	t.Run("a policy naming a tool no call could match is refused", func(t *testing.T) {
		if _, err := policy.Parse([]byte(`{"tools": {"echo/../x": {"approval": "never"}}}`)); err == nil || !strings.Contains(err.Error(), `tool name "echo/../x"`) {
			t.Fatalf("Parse = %v, want a tool name error", err)
		}
	})
}
