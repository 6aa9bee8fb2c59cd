package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// inboundCount is the number of messages in the inbound stream.
func (g *mcpGW) inboundCount() uint64 {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	st, err := g.JS.Stream(ctx, topology.StreamInbound)
	if err != nil {
		g.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		g.t.Fatal(err)
	}
	return info.State.Msgs
}

// waitRequested waits until n approvals were requested for tool with args
// (pipelinetest.AllRequested: in no order across turns).
func (g *mcpGW) waitRequested(tool, args string, n int) []string {
	g.t.Helper()
	var ids []string
	jstest.EventuallyState(g.t, pipelinetest.Wait, fmt.Sprintf("%d approvals requested for %s %s", n, tool, args), func() (bool, string) {
		ids = nil
		for _, a := range g.AllRequested() {
			if a.Tool == tool && a.Args == args {
				ids = append(ids, a.ApprovalID)
			}
		}
		return len(ids) >= n, fmt.Sprintf("%d requested", len(ids))
	})
	if len(ids) > n {
		g.t.Fatalf("%d approvals requested for %s %s, want %d", len(ids), tool, args, n)
	}
	return ids
}

// Each allow is one run by Claude Code, so each tool use needs its own
// decision: two identical hooks with their own tool_use_ids ask twice; a
// tool use asked again (a retried request) is the same call with its one
// decision, also after a gateway restart; a new tool use after a restart
// is not allowed without a new approval.
func TestHookEachToolUseNeedsItsOwnDecision(t *testing.T) {
	g := startHooks(t, nil, "claude.write")
	input := `{"content":"z","file_path":"/work/twice"}`
	type answer struct {
		use string
		d   HookDecision
	}
	answers := make(chan answer, 2)
	for _, use := range []string{"toolu_one", "toolu_two"} {
		go func() { answers <- answer{use, g.hookUse("a", "", "s-twice", "Write", input, use)} }()
	}
	// A session runs one turn at a time: the second tool use's turn is
	// queued behind the first, and asks once the first is decided.
	ids := g.waitRequested("claude.write", input, 1)
	g.WaitPending(ids[0])
	g.Decide(ids[0], "approve", "alice")
	allowed := <-answers
	if allowed.d.PermissionDecision != "allow" || !strings.Contains(allowed.d.PermissionDecisionReason, schemas.TurnIDOfApproval(ids[0])) {
		t.Fatalf("after approving %s: %+v, want allow for its turn", ids[0], allowed.d)
	}
	first := ids[0]
	ids = g.waitRequested("claude.write", input, 2)
	if ids[0] == ids[1] {
		t.Fatalf("one approval %s for two tool uses", ids[0])
	}
	if ids[1] == first { // the requests come in no order across turns' logs
		ids[0], ids[1] = ids[1], ids[0]
	}
	g.WaitPending(ids[1])
	select {
	case a := <-answers:
		t.Fatalf("the other tool use got %+v before anyone decided its approval", a.d)
	default:
	}
	g.Decide(ids[1], "deny", "alice")
	if a := <-answers; a.d.PermissionDecision != "deny" || !strings.HasPrefix(a.d.PermissionDecisionReason, string(schemas.CodeApprovalDenied)) {
		t.Fatalf("after denying %s: %+v, want deny %s", ids[1], a.d, schemas.CodeApprovalDenied)
	}

	again := func(what string) {
		t.Helper()
		d := g.hookUse("a", "?wait=2s", "s-twice", "Write", input, allowed.use)
		if d.PermissionDecision != "allow" || !strings.Contains(d.PermissionDecisionReason, schemas.TurnIDOfApproval(ids[0])) {
			t.Fatalf("%s: the approved tool use asked again got %+v, want its allow", what, d)
		}
	}
	again("before a restart")
	if d := g.hookUse("a", "?wait=2s", "s-twice", "Write", `{"content":"other","file_path":"/work/twice"}`, allowed.use); d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, string(CodeIdempotencyKeyReused)) {
		t.Fatalf("the approved tool use's id with another input: %+v, want deny %s", d, CodeIdempotencyKeyReused)
	}

	g.halt()
	g.serve()
	again("after a restart")
	d := g.hookUse("a", "?wait=300ms", "s-twice", "Write", input, "toolu_three")
	if d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, string(CodeDecisionPending)) {
		t.Fatalf("a new tool use after a restart: %+v, want deny %s", d, CodeDecisionPending)
	}
	g.waitRequested("claude.write", input, 3)
}

// A hook input without its session, tool or tool use is denied
// INVALID_INPUT and nothing is published.
func TestHookWithoutItsIDsIsRefusedAndPublishesNothing(t *testing.T) {
	g := startHooks(t, nil, "claude.bash")
	full := func() map[string]any {
		return map[string]any{"session_id": "s-ids", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": map[string]any{"command": "ls"}, "tool_use_id": "toolu_ids"}
	}
	for _, field := range []string{"session_id", "tool_name", "tool_use_id"} {
		for _, how := range []string{"missing", "empty"} {
			in := full()
			if how == "missing" {
				delete(in, field)
			} else {
				in[field] = ""
			}
			d := g.postHook("a", "", in)
			if d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, string(schemas.CodeInvalidInput)+": "+field) {
				t.Errorf("%s %s: %+v, want deny %s naming it", field, how, d, schemas.CodeInvalidInput)
			}
		}
	}
	if d := g.postHook("a", "", full()); d.PermissionDecision != "allow" {
		t.Fatalf("the whole input: %+v, want allow", d)
	}
	if n := g.inboundCount(); n != 1 {
		t.Fatalf("%d inbound messages, want only the whole input's", n)
	}
}

// The claude.* gate tools are for hooks only: MCP neither lists them
// (TestMCPListsTheToolsOfNATSToolServicesButNotTheGates) nor calls them.
func TestMCPDoesNotCallTheHookGates(t *testing.T) {
	g := startHooks(t, nil, "claude.bash")
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	r, err := g.client("a", nil).CallTool(ctx, &mcp.CallToolParams{Name: "claude.bash", Arguments: map[string]any{"command": "ls"}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.IsError || !strings.HasPrefix(text(r), string(schemas.CodeToolNotFound)+": ") {
		t.Fatalf("claude.bash over MCP: error %v, %q; want %s", r.IsError, text(r), schemas.CodeToolNotFound)
	}
	if d := g.hook("a", "", "s-gate", "Bash", `{"command":"ls"}`); d.PermissionDecision != "allow" {
		t.Fatalf("the hook: %+v, want allow", d)
	}
	if n := g.inboundCount(); n != 1 {
		t.Fatalf("%d inbound messages, want only the hook's", n)
	}
}

// A reason says its code once: in a hook's answer, and in an MCP result.
func TestReasonsSayTheirCodeOnce(t *testing.T) {
	g := startHooks(t, nil, "claude.bash")
	for _, tc := range []struct {
		name, tool string
		code       schemas.Code
	}{
		{"a tool the policy denies", "Read", schemas.CodePolicyDenied},
		{"a tool name that cannot name a gate", "No.Such.Tool", CodeToolNameInvalid},
	} {
		d := g.hook("a", "", "s-codes", tc.tool, `{}`)
		if r := d.PermissionDecisionReason; d.PermissionDecision != "deny" || !strings.HasPrefix(r, string(tc.code)+": ") || strings.Count(r, string(tc.code)) != 1 {
			t.Fatalf("hook of %s: %q, want it to start %s: and say it once", tc.name, r, tc.code)
		}
	}

	tl := &counter{}
	m := startMCP(t, tl)
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	r := result(t, callAsync(ctx, m.client("a", nil), "counter", map[string]any{"n": "not a number"}))
	got := text(r)
	if !r.IsError || !strings.HasPrefix(got, string(schemas.CodeArgsInvalid)+": arguments of counter") {
		t.Fatalf("counter with a string: error %v, %q; want %s said once", r.IsError, got, schemas.CodeArgsInvalid)
	}
}

// The default wait ends inside the shortest default timeout Claude Code
// gives a hook, with room for the answer to reach it: a hook that times
// out does not block the tool.
func TestHookDefaultWaitEndsInsideClaudeCodesTimeout(t *testing.T) {
	if claudeHookTimeout > 60*time.Second {
		t.Fatalf("claudeHookTimeout %s: earlier Claude Code versions give a hook 60 s", claudeHookTimeout)
	}
	if hookWait <= 0 || hookWait+hookMargin > claudeHookTimeout || hookMargin < 5*time.Second {
		t.Fatalf("default wait %s with margin %s does not fit inside %s", hookWait, hookMargin, claudeHookTimeout)
	}
}
