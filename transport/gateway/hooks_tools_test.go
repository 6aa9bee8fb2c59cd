package gateway

import (
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// hookToolsPolicy: every Claude Code tool runs at once but Bash, which is
// denied; nothing names any tool but claude.bash and the pattern.
const hookToolsPolicy = `{
  "version": "hook-tools-test",
  "default_approval": "required",
  "approvers": ["cli:alice"],
  "tools": {
    "claude.*":    {"approval": "never"},
    "claude.bash": {"approval": "deny"}
  }
}`

// TestTheHookGatesEveryToolClaudeCodeSends feeds the hook the tool names
// of Claude Code 2.1 (Agent, renamed from Task, among them), an MCP tool
// of a server the matcher includes, and a tool no release of Tollgate
// knows: each is gated by the policy's rule for its name, or "claude.*"
// (allowed), Bash by its own (denied POLICY_DENIED), with no
// TOOL_NOT_FOUND. A tool_name that cannot name a gate is denied
// TOOL_NAME_INVALID and publishes nothing.
func TestTheHookGatesEveryToolClaudeCodeSends(t *testing.T) {
	g := startHooksOn(t, pipelinetest.Options{Env: jstest.Start(t), Policy: hookToolsPolicy}, "claude.agent")
	for _, tc := range []struct {
		tool, input string
		allow       bool
	}{
		{"Agent", `{"description":"look around","prompt":"find the config","subagent_type":"Explore"}`, true},
		{"Edit", `{"file_path":"/work/a","old_string":"a","new_string":"b"}`, true},
		{"Write", `{"file_path":"/work/b","content":"b"}`, true},
		{"Read", `{"file_path":"/work/a"}`, true},
		{"Glob", `{"pattern":"**/*.go"}`, true},
		{"Grep", `{"pattern":"TODO"}`, true},
		{"WebFetch", `{"url":"https://example.com","prompt":"summarize"}`, true},
		{"WebSearch", `{"query":"tollgate"}`, true},
		{"NotebookEdit", `{"notebook_path":"/work/n.ipynb","new_source":"x"}`, true},
		{"TodoWrite", `{"todos":[]}`, true},
		{"Skill", `{"skill":"pdf"}`, true},
		{"ExitPlanMode", `{"plan":"do it"}`, true},
		{"PowerShell", `{"command":"dir"}`, true},
		{"mcp__github__create_issue", `{"title":"x","body":"y"}`, true},
		{"SomeToolOfANewerRelease", `{}`, true},
		{"Bash", `{"command":"ls"}`, false},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			d := g.hook("a", "", "s-tools", tc.tool, tc.input)
			switch {
			case tc.allow && d.PermissionDecision != "allow":
				t.Fatalf("%+v, want allow under claude.*", d)
			case !tc.allow && (d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, string(schemas.CodePolicyDenied))):
				t.Fatalf("%+v, want deny %s", d, schemas.CodePolicyDenied)
			}
		})
	}
	before := g.inboundCount()
	for _, tc := range []struct{ name, tool string }{
		{"a dot", "Bad.Name"},
		{"a space", "Bad Name"},
		{"a subject wildcard", "Bash>"},
		{"a non-ASCII letter", "Bäsh"},
		{"58 characters", strings.Repeat("x", 58)},
	} {
		t.Run("tool_name with "+tc.name, func(t *testing.T) {
			d := g.hook("a", "", "s-tools", tc.tool, `{}`)
			if d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, string(CodeToolNameInvalid)) {
				t.Fatalf("%+v, want deny %s", d, CodeToolNameInvalid)
			}
		})
	}
	if n := g.inboundCount(); n != before {
		t.Fatalf("%d inbound messages published for invalid tool names", n-before)
	}
	// 57 characters is the longest name a gate takes.
	if d := g.hook("a", "", "s-tools", strings.Repeat("y", 57), `{}`); d.PermissionDecision != "allow" {
		t.Fatalf("a 57-character tool name: %+v, want allow", d)
	}
}
