package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// hookPolicy: Claude Code's Bash runs at once, Read is denied, Write needs
// approval (cli:alice may decide).
const hookPolicy = `{
  "version": "hook-test",
  "default_approval": "required",
  "approvers": ["cli:alice"],
  "tools": {
    "claude.bash":  {"approval": "never"},
    "claude.read":  {"approval": "deny"},
    "claude.write": {"approval": "required"}
  }
}`

// startHooks starts a pipeline whose executor finds NATS tool services
// (the gateway's gate tools among them) and a gateway, and waits until
// the executor lists the tool named want.
func startHooks(t *testing.T, before func(env *jstest.Env), want string) *mcpGW {
	t.Helper()
	env := jstest.Start(t)
	if before != nil {
		before(env)
	}
	return startHooksOn(t, pipelinetest.Options{Env: env, Policy: hookPolicy}, want)
}

// startHooksOn is startHooks with the pipeline's options o (o.Env set).
func startHooksOn(t *testing.T, o pipelinetest.Options, want string) *mcpGW {
	t.Helper()
	env := o.Env
	o.Providers = append(o.Providers, natstool.New(env.NC, natstool.Options{Logger: pipelinetest.Logger(), RefreshInterval: 100 * time.Millisecond}))
	g := startGatewayOn(t, o)
	// The executor finds the gate tools at its next discovery.
	jstest.EventuallyState(t, jstest.Wait, "the executor lists "+want, func() (bool, string) {
		m, err := env.NC.Request(topology.SubjectToolsList, nil, time.Second)
		if err != nil {
			return false, err.Error()
		}
		return bytes.Contains(m.Data, []byte(`"`+want+`"`)), "tool list " + string(m.Data)
	})
	return g
}

// hook posts a PreToolUse input for tool with input as key name and
// returns the decision.
func (g *mcpGW) hook(key, query, session, tool, input string) HookDecision {
	g.t.Helper()
	return g.hookUse(key, query, session, tool, input, "toolu_"+g.NextID("u"))
}

// hookUse is hook for the tool use named useID.
func (g *mcpGW) hookUse(key, query, session, tool, input, useID string) HookDecision {
	g.t.Helper()
	return g.postHook(key, query, map[string]any{
		"session_id": session, "transcript_path": "/tmp/t.jsonl", "cwd": "/work", "permission_mode": "default",
		"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": json.RawMessage(input), "tool_use_id": useID,
	})
}

// postHook posts in as the hook input and returns the decision.
func (g *mcpGW) postHook(key, query string, in map[string]any) HookDecision {
	g.t.Helper()
	body, _ := json.Marshal(in)
	req, _ := http.NewRequest("POST", "http://"+g.addr+"/v1/hooks/pretooluse"+query, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+g.tokens[key])
	resp, err := g.tr.RoundTrip(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out HookOutput
	if resp.StatusCode != http.StatusOK {
		g.t.Fatalf("hook: status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		g.t.Fatal(err)
	}
	if out.HookSpecificOutput.HookEventName != "PreToolUse" {
		g.t.Fatalf("hookEventName %q", out.HookSpecificOutput.HookEventName)
	}
	return out.HookSpecificOutput
}

func TestHookPreToolUseAnswersWhatPolicyAndPeopleDecide(t *testing.T) {
	g := startHooks(t, nil, "claude.write")
	for _, tc := range []struct {
		name, tool, input, decision string
		code                        schemas.Code
	}{
		{"a tool policy allows is allowed at once", "Bash", `{"command":"ls"}`, "allow", ""},
		{"a tool policy denies is denied with the code", "Read", `{"file_path":"/etc/passwd"}`, "deny", schemas.CodePolicyDenied},
		{"a tool name that cannot name a gate is denied", "No.Such.Tool", `{}`, "deny", CodeToolNameInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := g.hook("a", "", "s1", tc.tool, tc.input)
			if d.PermissionDecision != tc.decision || !strings.HasPrefix(d.PermissionDecisionReason, string(tc.code)) {
				t.Fatalf("decision %+v, want %s %s", d, tc.decision, tc.code)
			}
		})
	}
	for _, tc := range []struct {
		name, option, decision string
		code                   schemas.Code
	}{
		{"a gated tool is allowed once a person approves", "approve", "allow", ""},
		{"a gated tool is denied when a person denies", "deny", "deny", schemas.CodeApprovalDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			input := `{"content":"x","file_path":"/work/` + tc.option + `"}`
			done := make(chan HookDecision, 1)
			go func() { done <- g.hook("a", "", "s-"+tc.option, "Write", input) }()
			id := g.pendingFor("claude.write", input)
			g.For(t).Decide(id, tc.option, "alice")
			d := <-done
			if d.PermissionDecision != tc.decision || !strings.HasPrefix(d.PermissionDecisionReason, string(tc.code)) {
				t.Fatalf("decision %+v, want %s %s", d, tc.decision, tc.code)
			}
		})
	}
	t.Run("a body that is not a hook input is a deny with its code, and no key is a 401", func(t *testing.T) {
		for _, tc := range []struct {
			key    string
			status int
			want   string
		}{
			{"a", http.StatusOK, `"permissionDecision":"deny","permissionDecisionReason":"MALFORMED_PAYLOAD: `},
			{"", http.StatusUnauthorized, `"code":"UNAUTHENTICATED"`},
		} {
			req, _ := http.NewRequest("POST", "http://"+g.addr+"/v1/hooks/pretooluse", strings.NewReader("not json"))
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+g.tokens[tc.key])
			}
			resp, err := g.tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(body.String(), tc.want) {
				t.Errorf("key %q: %d %s, want %d with %s", tc.key, resp.StatusCode, body.String(), tc.status, tc.want)
			}
		}
	})
	t.Run("no decision within the wait is a deny, and the same tool use asked again picks up the approval", func(t *testing.T) {
		input := `{"content":"y","file_path":"/work/later"}`
		d := g.hookUse("a", "?wait=300ms", "s-later", "Write", input, "toolu_later")
		if d.PermissionDecision != "deny" || !strings.HasPrefix(d.PermissionDecisionReason, string(CodeDecisionPending)) {
			t.Fatalf("decision %+v, want deny %s", d, CodeDecisionPending)
		}
		id := g.pendingFor("claude.write", input)
		g.For(t).Decide(id, "approve", "alice")
		g.WaitTerminal(schemas.TurnIDOfApproval(id))
		if d := g.hookUse("a", "", "s-later", "Write", input, "toolu_later"); d.PermissionDecision != "allow" {
			t.Fatalf("decision %+v, want allow", d)
		}
		if n := g.requested("claude.write", input); n != 1 {
			t.Fatalf("%d approvals requested, want 1", n)
		}
	})
}

func TestMCPListsTheToolsOfNATSToolServicesButNotTheGates(t *testing.T) {
	g := startHooks(t, func(env *jstest.Env) {
		svc, err := micro.AddService(env.NC, micro.Config{Name: "deploys", Version: "1.0.0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = svc.Stop() })
		err = svc.AddGroup(natstool.SubjectPrefix+"deploys").AddEndpoint("rollout", micro.HandlerFunc(func(r micro.Request) { _ = r.Respond([]byte("ok")) }),
			micro.WithEndpointMetadata(map[string]string{natstool.MetaSchema: `{"type":"object","properties":{"version":{"type":"string"}}}`}))
		if err != nil {
			t.Fatal(err)
		}
	}, "deploys.rollout")
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	l, err := g.client("a", nil).ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range l.Tools {
		names = append(names, tool.Name)
		if tool.Name == "deploys.rollout" && !strings.Contains(fmt.Sprint(tool.InputSchema), "version") {
			t.Errorf("deploys.rollout's schema %s, want the service's", tool.InputSchema)
		}
	}
	if !slices.Contains(names, "deploys.rollout") {
		t.Errorf("tools %v: want deploys.rollout", names)
	}
	if slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "claude.") }) {
		t.Errorf("tools %v: the hook gates are listed", names)
	}
}
