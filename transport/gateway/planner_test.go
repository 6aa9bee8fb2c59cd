package gateway

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestAPlannerTurnsEventsEndWithItsReply: a text-only submit becomes an
// agent loop; its per-turn event stream, opened while the loop waits for a
// person (longer than the gateway's submit wait), shows the loop's reply
// event with the model's text and then the turn's outcome. The loop's batch
// record exists from the moment the planner records the turn, so the
// stream does not answer "unknown" while the loop runs.
func TestAPlannerTurnsEventsEndWithItsReply(t *testing.T) {
	model := plannertest.New(t)
	opts := planner.Options{Model: planner.ModelConfig{BaseURL: model.URL, Model: "scripted", MaxRetries: 1, Timeout: 10 * time.Second}}
	g := startGateway(t, pipelinetest.Options{Planner: &opts, Stages: append(slices.Clone(pipelinetest.AllStages), tollgate.StagePlanner)},
		func(c *Config) { c.SubmitWait = 300 * time.Millisecond })
	text := "say hello through the gateway"
	model.Script(text,
		plannertest.Reply{Calls: []plannertest.Call{{Name: "write_file", Args: `{"path":"hello.txt","content":"hi"}`}}},
		plannertest.Reply{Text: "hello from the model"})
	req := submitBody("s-plan", "alice")
	req.Text = text
	sub := g.submit("a", req)
	a := g.WaitPending(schemas.ApprovalID(schemas.PlannerStepTurnID(sub.TurnID, 0), 0))
	pastSubmitWait := time.Now().Add(time.Second)
	jstest.Eventually(t, jstest.Wait, "past the submit wait", func() bool { return time.Now().After(pastSubmitWait) })

	stream := g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a")
	defer stream.close()
	resp, body := g.do("POST", "/v1/approvals/"+a.ApprovalID+"/decisions", "a",
		DecisionRequest{Option: "approve", ArgsDigest: a.ArgsDigest, Decider: SenderIn{ID: "alice"}})
	want[DecisionResponse](t, resp, body, 200)
	var kinds []string
	for {
		ev := stream.nextEvent(t, 20*time.Second)
		kinds = append(kinds, ev.kind)
		if ev.kind == "turn.reply" {
			var payload map[string]any
			if err := json.Unmarshal([]byte(ev.data), &payload); err != nil || payload["text"] != "hello from the model" || payload["turn_id"] != sub.TurnID {
				t.Fatalf("reply event %s: %v", ev.data, err)
			}
		}
		if ev.kind == "turn.outcome" {
			break
		}
	}
	if !slices.Contains(kinds, "turn.reply") {
		t.Fatalf("no turn.reply before the outcome: %v", kinds)
	}
}

// TestThePlannerNeverOffersTheHookGates: with the gateway serving the
// gate tools of Claude Code's hooks (claude.*, allowed by the policy) and
// the executor listing them, a planner turn offers the model its tools
// but no gate; a model that names one anyway (claude.bash, or its
// function name) gets TOOL_NOT_FOUND back, as over MCP, and the gate
// tool does not run.
func TestThePlannerNeverOffersTheHookGates(t *testing.T) {
	model := plannertest.New(t)
	opts := planner.Options{Model: planner.ModelConfig{BaseURL: model.URL, Model: "scripted", MaxRetries: 1, Timeout: 10 * time.Second}}
	g := startHooksOn(t, pipelinetest.Options{Env: jstest.Start(t), Policy: callIDPolicy, Planner: &opts,
		Stages: append(slices.Clone(pipelinetest.AllStages), tollgate.StagePlanner)}, "claude.bash")
	text := "run ls through the hook's gate"
	model.Script(text,
		plannertest.Reply{Calls: []plannertest.Call{{Name: "claude.bash", Args: `{"command":"ls"}`}, {Name: "claude__write", Args: `{"file_path":"/x"}`}}},
		plannertest.Reply{Text: "done"})
	status, body := g.post("a", "/v1/turns", SubmitRequest{SessionID: "s-plan-gates", Sender: SenderIn{ID: "alice"}, Text: text})
	var sub SubmitResponse
	if err := json.Unmarshal(body, &sub); err != nil || status != 202 {
		t.Fatalf("submit: %d %s", status, body)
	}
	g.WaitTerminal(sub.TurnID)
	reqs := model.Requests(text)
	if len(reqs) != 2 {
		t.Fatalf("%d model requests, want 2", len(reqs))
	}
	names := reqs[0].ToolNames()
	if !slices.Contains(names, "echo") || slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "claude") }) {
		t.Fatalf("offered %v: want echo and no claude.* gate", names)
	}
	results := reqs[1].ToolResults()
	if len(results) != 2 || !strings.Contains(results[0], string(schemas.CodeToolNotFound)) || !strings.Contains(results[1], string(schemas.CodeToolNotFound)) {
		t.Fatalf("tool results %q: want TOOL_NOT_FOUND for both gates", results)
	}
}
