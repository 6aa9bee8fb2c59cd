package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

// `tollgate tools` asks a running executor, on a real server, for every
// tool it can call: built-ins and a provider's, each with its source,
// schema, retry safety and policy mode per audience.
func TestToolsListsEveryToolWithItsPolicyModes(t *testing.T) {
	yes := true
	prov := &pt.Provider{ProviderName: "nats"}
	prov.Set(&pt.Remote{Counter: pt.Counter{ToolName: "deploys.rollback"}, Safe: true, Desc: tools.Spec{
		Source: "nats:deploys", Description: "Rolls a service back to its previous release.",
		InputSchema: json.RawMessage(`{"type": "object", "properties": {"service": {"type": "string"}}}`),
		Hints:       tools.Hints{Destructive: &yes},
	}})
	h := pt.Start(t, pt.Options{Stages: []string{pt.Executor}, Providers: []tools.Provider{prov}, Policy: `{
	  "version": "tools-cli",
	  "tools": {"echo": {"approval": "never"}, "deploys.*": {"approval": "never", "audiences": {"public": "deny"}}},
	  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
	}`})
	url := "--nats=" + h.Env.URL()
	// The executor serves the list once it has started: wait for its first
	// answer, so the command is not asked before anyone listens.
	jstest.Eventually(t, pt.Wait, "the executor answers "+topology.SubjectToolsList, func() bool {
		_, err := h.Env.NC.Request(topology.SubjectToolsList, nil, time.Second)
		return err == nil
	})

	t.Run("--json is the executor's answer", func(t *testing.T) {
		code, out, errOut := runCLI(t, "tools", url, "--json")
		var l schemas.ToolList
		if err := json.Unmarshal([]byte(out), &l); code != 0 || err != nil {
			t.Fatalf("exit %d, %v, stderr %q:\n%s", code, err, errOut, out)
		}
		var names []string
		for _, tool := range l.Tools {
			names = append(names, tool.Name)
		}
		if got := strings.Join(names, " "); l.PolicyVersion != "tools-cli" || got != "deploys.rollback echo schedule_followup write_file" {
			t.Fatalf("policy %s, tools %s", l.PolicyVersion, got)
		}
		d := l.Tools[0]
		want := map[schemas.Audience]policy.Mode{schemas.AudiencePersonal: policy.ModeRequired, schemas.AudienceTeam: policy.ModeRequired, schemas.AudiencePublic: policy.ModeDeny}
		if d.Source != "nats:deploys" || !d.RetrySafe || !strings.Contains(string(d.InputSchema), `"service"`) || len(d.Modes) != 3 {
			t.Fatalf("deploys.rollback listed as %+v", d)
		}
		for a, m := range want {
			if d.Modes[a] != m {
				t.Fatalf("deploys.rollback for %s: %s, want %s (destructive under a free pattern)", a, d.Modes[a], m)
			}
		}
	})

	t.Run("the text lists the same", func(t *testing.T) {
		code, out, errOut := runCLI(t, "tools", url)
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		for _, want := range []string{
			"policy tools-cli, 4 tools",
			"deploys.rollback  (nats:deploys, safe to re-run)", "Rolls a service back", "policy: personal required, team required, public deny",
			"claims: destructive true", `arguments: {"type":"object","properties":{"service":{"type":"string"}}}`,
			"echo  (builtin, safe to re-run)", "policy: personal never, team never, public never",
			"write_file  (builtin, not safe to re-run)", `"required":["path"]`,
		} {
			if !strings.Contains(out, want) {
				t.Fatalf("tools does not say %q:\n%s", want, out)
			}
		}
	})
}

func TestToolsWithoutAnExecutorSaysSo(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{}})
	code, _, errOut := runCLI(t, "tools", "--nats="+h.Env.URL())
	if code != 1 || !strings.Contains(errOut, "no executor answered") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// The gateway's Claude Code gate tools (claude.*) are one block in the
// text, not one each, unless --all is given; --json lists every one.
func TestToolsGroupsTheClaudeGateTools(t *testing.T) {
	prov := &pt.Provider{ProviderName: "nats"}
	var gates []tools.Tool
	for _, name := range gateway.ClaudeTools {
		gates = append(gates, &pt.Remote{Counter: pt.Counter{ToolName: "claude." + name}, Safe: true, Desc: tools.Spec{
			Source: claudeGateSource, Description: "Gate for Claude Code's " + name + " tool",
		}})
	}
	prov.Set(gates...)
	h := pt.Start(t, pt.Options{Stages: []string{pt.Executor}, Providers: []tools.Provider{prov}})
	url := "--nats=" + h.Env.URL()
	jstest.Eventually(t, pt.Wait, "the executor answers "+topology.SubjectToolsList, func() bool {
		_, err := h.Env.NC.Request(topology.SubjectToolsList, nil, time.Second)
		return err == nil
	})
	code, out, errOut := runCLI(t, "tools", url)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if n := strings.Count(out, "Gate for Claude Code"); n != 0 || !strings.Contains(out, fmt.Sprintf("claude.*  (nats:claude, %d gate tools", len(gateway.ClaudeTools))) ||
		!strings.Contains(out, "claude.agent claude.askuserquestion claude.bash") || !strings.Contains(out, "echo  (builtin") {
		t.Fatalf("tools does not group the gate tools in one block (%d described):\n%s", n, out)
	}
	code, out, _ = runCLI(t, "tools", url, "--all")
	if n := strings.Count(out, "Gate for Claude Code"); code != 0 || n != len(gateway.ClaudeTools) {
		t.Fatalf("tools --all: exit %d, %d gate tools described, want %d:\n%s", code, n, len(gateway.ClaudeTools), out)
	}
	code, out, _ = runCLI(t, "tools", url, "--json")
	if n := strings.Count(out, `"name": "claude.`); code != 0 || n != len(gateway.ClaudeTools) {
		t.Fatalf("tools --json: exit %d, %d gate tools listed, want %d", code, n, len(gateway.ClaudeTools))
	}
}
