package planner_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
)

// BenchmarkTurn measures one turn at a time, end to end on an embedded
// server: a planner turn whose scripted model answers at once (one echo
// call, then the final text: two model steps and one batch), next to the
// same echo call sent by a transport with no planner in the way. The
// difference in ns/op is what the loop adds: two model requests
// (model-ms/step, HTTP included), the step batch's message schedule, the
// outcome's trip back to the planner, and the turn's own end (reply,
// conversation, terminal batch record, outcome).
func BenchmarkTurn(b *testing.B) {
	b.Run("planner: one tool call, then the answer", func(b *testing.B) {
		f := start(b, planner.Budget{}, false)
		var turns int
		begin := time.Now()
		for b.Loop() {
			turns++
			text := fmt.Sprintf("bench turn %d", turns)
			f.model.Script(text,
				plannertest.Reply{Calls: []plannertest.Call{{Name: "echo", Args: `{"text":"x"}`}}},
				plannertest.Reply{Text: "done"})
			f.waitReply(f.say(fmt.Sprintf("bench-%d", turns), text))
		}
		elapsed := time.Since(begin)
		model := histogramSum(b, f, "tollgate_planner_model_seconds")
		b.ReportMetric(float64(turns)/elapsed.Seconds(), "turns/s")
		b.ReportMetric(model*1000/float64(2*turns), "model-ms/step")
	})
	b.Run("transport call: the same echo, no planner", func(b *testing.B) {
		f := start(b, planner.Budget{}, false)
		var turns int
		begin := time.Now()
		for b.Loop() {
			turns++
			f.WaitOutcome(f.Send(f.Inbound(fmt.Sprintf("direct-%d", turns), "alice", pipelinetest.Call("echo", `{"text":"x"}`))))
		}
		b.ReportMetric(float64(turns)/time.Since(begin).Seconds(), "turns/s")
	})
}

// histogramSum is the sum of the histogram name.
func histogramSum(b testing.TB, f *fixture, name string) float64 {
	b.Helper()
	mfs, err := f.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleSum()
		}
	}
	return 0
}
