package executor_test

import (
	"context"
	"fmt"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
)

// BenchmarkExecutorAcceptFastPath is the executor's hot path for a turn
// needing no approval: create the batch, take the session, run echo under a
// claim, end the batch, publish the outcome and release the session. It
// runs against a real embedded server.
func BenchmarkExecutorAcceptFastPath(b *testing.B) {
	h := pt.Start(b, pt.Options{Stages: []string{}})
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		at := h.Accept(h.Inbound(fmt.Sprintf("bench-%d", i), "alice", pt.Call("echo", `{"text":"hi"}`)))
		if err := h.Executor.Accept(context.Background(), at); err != nil {
			b.Fatal(err)
		}
	}
}
