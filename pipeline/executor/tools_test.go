package executor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// toolsPolicy names provider tools by pattern.
const toolsPolicy = `{
  "version": "tools-1",
  "default_approval": "required",
  "tools": {
    "echo":        {"approval": "never"},
    "write_file":  {"approval": "required", "audiences": {"public": "deny"}},
    "svc.*":       {"approval": "never", "audiences": {"public": "deny"}},
    "svc.guarded": {"approval": "required"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// typed is a provider tool of service svc that takes {"n": integer >= 1}.
func typed(name string, hints tools.Hints) *pt.Remote {
	return &pt.Remote{Counter: pt.Counter{ToolName: name}, Desc: tools.Spec{
		Source: "nats:svc", Description: "a typed tool", Hints: hints,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"],"additionalProperties":false}`),
	}}
}

// noPrompt fails the test if turn's call index 0 got an approval record or
// an approval-requested event (read after the turn is terminal).
func noPrompt(h *pt.H, turn string) {
	h.T.Helper()
	if a := h.Approval(schemas.ApprovalID(turn, 0)); a != nil {
		h.T.Fatalf("approval record created: %+v", a)
	}
	if n := len(h.Requested(turn)); n != 0 {
		h.T.Fatalf("%d approval-requested events", n)
	}
}

// Arguments are checked against the tool's schema before anyone is asked:
// arguments it refuses fail the call with ARGS_INVALID, naming the places,
// and nobody is prompted and nothing runs.
func TestArgumentsAreCheckedBeforeAnyoneIsAsked(t *testing.T) {
	guarded, free := typed("svc.guarded", tools.Hints{}), typed("svc.free", tools.Hints{})
	prov := &pt.Provider{ProviderName: "nats"}
	prov.Set(guarded, free)
	h := pt.Start(t, pt.Options{Policy: toolsPolicy, Providers: []tools.Provider{prov}})
	tests := []struct {
		name string
		call schemas.ProposedCall
		says []string
	}{
		{"a built-in's call without a required argument, under approval", pt.Call("write_file", `{"content":"x"}`),
			[]string{"missing property 'path'", "schema #/required"}},
		{"a built-in's call with an argument it does not take, run at once", pt.Call("echo", `{"text":"x","to":"all"}`),
			[]string{"'to' not allowed", "schema #/additionalProperties"}},
		{"a provider tool's call with a wrong type, under approval", pt.Call("svc.guarded", `{"n":"two"}`),
			[]string{"at '/n'", "got string, want integer", "schema #/properties/n/type"}},
		{"a provider tool's call out of range, run at once", pt.Call("svc.free", `{"n":0}`),
			[]string{"at '/n'", "schema #/properties/n/minimum"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			turn := h.Send(h.Inbound("args-"+tc.call.Tool, "alice", tc.call))
			b, out := h.WaitTerminal(turn)
			r := b.Results[0]
			if r.Status != schemas.ResultFailed || r.Code != schemas.CodeArgsInvalid || out.Results[0].Code != schemas.CodeArgsInvalid {
				t.Fatalf("result %+v, want failed ARGS_INVALID", r)
			}
			for _, s := range tc.says {
				if !strings.Contains(r.Reason, s) {
					t.Fatalf("reason %q does not say %q", r.Reason, s)
				}
			}
			noPrompt(h, turn)
		})
	}
	if n := guarded.Total() + free.Total(); n != 0 {
		t.Fatalf("tools ran %d times with arguments their schema refuses", n)
	}
	if files := h.SandboxFiles(); len(files) != 0 {
		t.Fatalf("sandbox has %v", files)
	}
	// The same tools with valid arguments are asked about and run: the
	// refusals above are the schema's.
	turn := h.Send(h.Inbound("args-valid", "alice", pt.Call("svc.guarded", `{"n":2}`), pt.Call("svc.free", `{"n":1}`)))
	h.WaitPending(schemas.ApprovalID(turn, 0))
	h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
	if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultOK || b.Results[1].Status != schemas.ResultOK {
		t.Fatalf("valid calls: %+v %+v", b.Results[0], b.Results[1])
	}
}

// A provider's tool is governed by the policy like any tool: by pattern,
// with a destructive hint turning a pattern's "never" into "required", and
// a tool that appears after start needing approval unless the policy says
// otherwise. A tool no provider has fails with TOOL_NOT_FOUND, and one
// whose provider cannot list its tools with TOOL_UNAVAILABLE, both without
// a prompt.
func TestProviderToolsFollowThePolicy(t *testing.T) {
	yes := true
	free, destructive := typed("svc.lookup", tools.Hints{}), typed("svc.wipe", tools.Hints{Destructive: &yes})
	prov := &pt.Provider{ProviderName: "nats"}
	prov.Set(free, destructive)
	down := &pt.Provider{ProviderName: "mcp:down"}
	h := pt.Start(t, pt.Options{Policy: toolsPolicy, Providers: []tools.Provider{prov, down}})

	t.Run("a pattern lets a tool run at once", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("p-free", "alice", pt.Call("svc.lookup", `{"n":1}`)))
		if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultOK || free.Runs(b.Calls[0].CallID) != 1 {
			t.Fatalf("result %+v", b.Results[0])
		}
		noPrompt(h, turn)
	})
	t.Run("a pattern's audience rule denies", func(t *testing.T) {
		h := h.For(t)
		m := h.Inbound("p-public", "alice", pt.Call("svc.lookup", `{"n":1}`))
		m.Channel.Kind = schemas.ChannelPublic
		turn := h.Send(m)
		if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultDenied || b.Results[0].Code != schemas.CodePolicyDenied {
			t.Fatalf("result %+v, want denied", b.Results[0])
		}
	})
	t.Run("a destructive tool under a free pattern needs approval", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("p-wipe", "alice", pt.Call("svc.wipe", `{"n":1}`)))
		h.WaitPending(schemas.ApprovalID(turn, 0))
		if destructive.Total() != 0 {
			t.Fatal("the destructive tool ran before an approval")
		}
		h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
		if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultOK || destructive.Runs(b.Calls[0].CallID) != 1 {
			t.Fatalf("result %+v", b.Results[0])
		}
	})
	t.Run("a tool that appears after start needs approval by default", func(t *testing.T) {
		h := h.For(t)
		late := typed("reports.build", tools.Hints{})
		prov.Set(free, destructive, late)
		turn := h.Send(h.Inbound("p-late", "alice", pt.Call("reports.build", `{"n":3}`)))
		a := h.WaitPending(schemas.ApprovalID(turn, 0))
		if a.Tool != "reports.build" || late.Total() != 0 {
			t.Fatalf("approval %+v, runs %d", a, late.Total())
		}
		h.Decide(a.ApprovalID, schemas.OptionApprove, "alice")
		if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultOK || late.Total() != 1 {
			t.Fatalf("result %+v, runs %d", b.Results[0], late.Total())
		}
	})
	t.Run("a tool nobody has fails without a prompt", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("p-none", "alice", pt.Call("svc.nothing", `{}`)))
		if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultFailed || b.Results[0].Code != schemas.CodeToolNotFound {
			t.Fatalf("result %+v, want failed TOOL_NOT_FOUND", b.Results[0])
		}
		noPrompt(h, turn)
	})
	t.Run("a tool nobody has while a provider cannot list fails as unavailable", func(t *testing.T) {
		h := h.For(t)
		down.Fail(context.DeadlineExceeded)
		defer down.Fail(nil)
		turn := h.Send(h.Inbound("p-down", "alice", pt.Call("github.create_issue", `{}`)))
		b, _ := h.WaitTerminal(turn)
		if r := b.Results[0]; r.Status != schemas.ResultFailed || r.Code != schemas.CodeToolUnavailable || !strings.Contains(r.Reason, "mcp:down") {
			t.Fatalf("result %+v, want failed TOOL_UNAVAILABLE naming the provider", r)
		}
		noPrompt(h, turn)
	})
}

// A remote call that may have acted is reported needs_attention, and a
// redelivered accepted turn whose call has a recorded result does not
// send the call again.
func TestAnUncertainRemoteCallIsReportedAndNotSentAgain(t *testing.T) {
	tool := typed("svc.transfer", tools.Hints{})
	tool.Fail = func(tools.Call) error { return fmt.Errorf("no reply within the deadline: %w", tools.ErrUncertain) }
	prov := &pt.Provider{ProviderName: "nats"}
	prov.Set(tool)
	h := pt.Start(t, pt.Options{Policy: toolsPolicy, Providers: []tools.Provider{prov}})
	at := h.Accept(h.Inbound("uncertain", "alice", pt.Call("svc.transfer", `{"n":5}`)))
	subj := topology.AcceptedSubject(schemas.SessionKey("cli", "uncertain"))
	h.Publish(subj, "", at)
	b, out := h.WaitTerminal(at.TurnID)
	if r := out.Results[0]; r.Status != schemas.ResultNeedsAttention || r.Code != schemas.CodeExecutionUncertain {
		t.Fatalf("result %+v, want needs_attention EXECUTION_UNCERTAIN", r)
	}
	seq := h.Publish(subj, "", at) // a redelivery (no message id: not deduplicated)
	h.WaitConsumed(pt.Executor, seq)
	if n := tool.Runs(b.Calls[0].CallID); n != 1 {
		t.Fatalf("the call was sent %d times, want 1", n)
	}
	if outs := h.Outcomes(at.TurnID); len(outs) != 1 {
		t.Fatalf("%d outcomes, want 1", len(outs))
	}
}

// The executor answers tollgate.tools.list with every tool, its source,
// schema and retry safety, and the policy's mode for each audience.
func TestTheExecutorListsItsTools(t *testing.T) {
	yes := true
	prov := &pt.Provider{ProviderName: "nats"}
	prov.Set(typed("svc.lookup", tools.Hints{}), typed("svc.wipe", tools.Hints{Destructive: &yes}))
	h := pt.Start(t, pt.Options{Policy: toolsPolicy, Providers: []tools.Provider{prov}, Stages: []string{pt.Executor}})
	nc := h.Env.NC
	var l schemas.ToolList
	var msg *nats.Msg
	jstest.EventuallyState(t, pt.Wait, "an answer on "+topology.SubjectToolsList, func() (bool, string) {
		var err error
		msg, err = nc.Request(topology.SubjectToolsList, nil, 2*time.Second)
		return err == nil, fmt.Sprint(err)
	})
	if err := json.Unmarshal(msg.Data, &l); err != nil {
		t.Fatalf("answer %s: %v", msg.Data, err)
	}
	if l.PolicyVersion != "tools-1" || len(l.Errors) != 0 {
		t.Fatalf("list %+v", l)
	}
	want := map[string]struct {
		source string
		safe   bool
		modes  [3]policy.Mode // personal, team, public
	}{
		"echo":              {"builtin", true, [3]policy.Mode{"never", "never", "never"}},
		"write_file":        {"builtin", false, [3]policy.Mode{"required", "required", "deny"}},
		"schedule_followup": {"builtin", false, [3]policy.Mode{"required", "required", "required"}},
		"svc.lookup":        {"nats:svc", false, [3]policy.Mode{"never", "never", "deny"}},
		"svc.wipe":          {"nats:svc", false, [3]policy.Mode{"required", "required", "deny"}},
	}
	if len(l.Tools) != len(want) {
		t.Fatalf("%d tools listed, want %d: %+v", len(l.Tools), len(want), l.Tools)
	}
	for i, tool := range l.Tools {
		w, ok := want[tool.Name]
		if !ok || i > 0 && l.Tools[i-1].Name >= tool.Name {
			t.Fatalf("tool %s listed (at %d): want %v, sorted by name", tool.Name, i, want)
		}
		got := [3]policy.Mode{tool.Modes[schemas.AudiencePersonal], tool.Modes[schemas.AudienceTeam], tool.Modes[schemas.AudiencePublic]}
		if tool.Source != w.source || tool.RetrySafe != w.safe || got != w.modes || len(tool.InputSchema) == 0 || tool.Description == "" {
			t.Fatalf("tool %+v, want source %s retry_safe %v modes %v, a schema and a description", tool, w.source, w.safe, w.modes)
		}
	}
}
