package policy_test

import (
	"slices"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const patterns = `{
  "version": "patterns",
  "default_approval": "never",
  "tools": {
    "github.*":              {"approval": "never", "audiences": {"public": "deny"}, "expires_after": "1h", "options": ["approve"]},
    "github.admin.*":        {"approval": "required", "approvers": ["cli:root"]},
    "github.admin.audit":    {"approval": "never"},
    "github.delete_repo":    {"approval": "never"},
    "deploy.*":              {"approval": "required", "deciders": {"requester": false, "principals": ["cli:ops"]}},
    "fs.*":                  {"approval": "deny"}
  }
}`

func TestModeForPatternsAndHints(t *testing.T) {
	p := mustParse(t, patterns)
	yes, no := true, false
	destructive := tools.Hints{Destructive: &yes}
	readOnly := tools.Hints{ReadOnly: &yes, Destructive: &no}
	tests := []struct {
		name     string
		tool     string
		audience schemas.Audience
		hints    tools.Hints
		want     policy.Mode
	}{
		{"a pattern names a provider's tools", "github.create_issue", schemas.AudienceTeam, tools.Hints{}, policy.ModeNever},
		{"a pattern's audience rule applies", "github.create_issue", schemas.AudiencePublic, tools.Hints{}, policy.ModeDeny},
		{"the longest matching pattern wins", "github.admin.add_user", schemas.AudienceTeam, tools.Hints{}, policy.ModeRequired},
		{"the longest pattern replaces the shorter one's audiences", "github.admin.add_user", schemas.AudiencePublic, tools.Hints{}, policy.ModeRequired},
		{"an exact name wins over every pattern", "github.admin.audit", schemas.AudiencePublic, tools.Hints{}, policy.ModeNever},
		{"a pattern does not match its bare prefix", "github", schemas.AudiencePublic, tools.Hints{}, policy.ModeNever},
		{"a pattern does not match a longer first name", "githubx.read", schemas.AudiencePublic, tools.Hints{}, policy.ModeNever},
		{"a destructive tool is not run freely through a pattern", "github.create_issue", schemas.AudienceTeam, destructive, policy.ModeRequired},
		{"a destructive tool is not run freely through the default", "mail.send", schemas.AudienceTeam, destructive, policy.ModeRequired},
		{"a destructive hint never loosens a pattern's deny", "github.create_issue", schemas.AudiencePublic, destructive, policy.ModeDeny},
		{"a destructive hint never changes an exact rule", "github.delete_repo", schemas.AudienceTeam, destructive, policy.ModeNever},
		{"a read-only hint never loosens a pattern", "deploy.status", schemas.AudienceTeam, readOnly, policy.ModeRequired},
		{"a read-only hint never loosens a deny", "fs.read_file", schemas.AudienceTeam, readOnly, policy.ModeDeny},
		{"a tool claiming not to be destructive runs as the pattern says", "github.create_issue", schemas.AudienceTeam, readOnly, policy.ModeNever},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.ModeFor(tc.tool, tc.audience, tc.hints); got != tc.want {
				t.Fatalf("ModeFor(%s, %s) = %s, want %s", tc.tool, tc.audience, got, tc.want)
			}
		})
	}
	t.Run("a new tool with no rule and no hints is required under the built-in default", func(t *testing.T) {
		if got := policy.Default().ModeFor("deploy.run", schemas.AudienceTeam, tools.Hints{}); got != policy.ModeRequired {
			t.Fatalf("ModeFor = %s, want required", got)
		}
	})
}

// Everything a rule sets comes from the one rule that applies to the tool.
func TestAPatternRuleAppliesWhole(t *testing.T) {
	p := mustParse(t, patterns)
	tc := turn(schemas.AudienceTeam, "local")
	tests := []struct {
		name     string
		tool     string
		options  []string
		expiry   time.Duration
		deciders map[string]bool // who of alice, ops, root may decide
	}{
		{"the pattern's options, expiry and deciders", "github.create_issue", []string{schemas.OptionApprove}, time.Hour,
			map[string]bool{"cli:alice": true}},
		{"the longer pattern's, not merged with the shorter one's", "github.admin.add_user", []string{schemas.OptionApprove, schemas.OptionDeny}, policy.DefaultExpiry,
			map[string]bool{"cli:alice": true, "cli:root": true}},
		{"a pattern's decider rule", "deploy.run", []string{schemas.OptionApprove, schemas.OptionDeny}, policy.DefaultExpiry,
			map[string]bool{"cli:ops": true}},
		{"no rule: the defaults", "mail.send", []string{schemas.OptionApprove, schemas.OptionDeny}, policy.DefaultExpiry,
			map[string]bool{"cli:alice": true}},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			if got := p.Options(c.tool); !slices.Equal(got, c.options) {
				t.Fatalf("Options = %v, want %v", got, c.options)
			}
			if got := p.ExpiresAfter(c.tool); got != c.expiry {
				t.Fatalf("ExpiresAfter = %v, want %v", got, c.expiry)
			}
			got := allowed(p, c.tool, tc, schemas.AssuranceVerified, []string{"cli:alice", "cli:ops", "cli:root"})
			if len(got) != len(c.deciders) {
				t.Fatalf("deciders %v, want %v", got, c.deciders)
			}
			for w := range c.deciders {
				if !got[w] {
					t.Fatalf("deciders %v, want %v", got, c.deciders)
				}
			}
		})
	}
}
