package pipelinetest_test

import (
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Each turn made terminal is counted once, by its state, and each of its
// calls' results by status and code: what the needs_attention alert and
// the dashboard's result panels read.
func TestTurnsAndCallResultsAreCounted(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	m := h.Inbound("counted", "alice", pt.Call("echo", `{"text":"hi"}`), pt.Call("write_file", `{"path":"x","content":"y"}`))
	m.Channel = schemas.Channel{ID: "general", Kind: schemas.ChannelPublic} // write_file is denied for a public audience
	turn := h.Send(m)
	b, _ := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || b.Results[0].Status != schemas.ResultOK || b.Results[1].Status != schemas.ResultDenied {
		t.Fatalf("batch %s with results %+v %+v, want completed with ok and denied", b.State, b.Results[0], b.Results[1])
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"tollgate_turns_ended_total", map[string]string{"state": "completed"}, 1},
		{"tollgate_call_results_total", map[string]string{"status": "ok", "code": ""}, 1},
		{"tollgate_call_results_total", map[string]string{"status": "denied", "code": string(schemas.CodePolicyDenied)}, 1},
	} {
		if got := h.Metric(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
