package executor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/executor"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// gatedPreview is a test tool whose previews wait for open to be closed
// (ignoring their context), and that counts how often it is asked and how
// many previews run at once at most.
type gatedPreview struct {
	pt.Counter
	open           chan struct{}
	asked, running atomic.Int64
	mu             sync.Mutex
	mostAtOnce     int64
}

func newGatedPreview(name string) *gatedPreview {
	return &gatedPreview{Counter: pt.Counter{ToolName: name}, open: make(chan struct{})}
}

func (g *gatedPreview) Preview(_ context.Context, c tools.Call) (tools.Preview, error) {
	g.asked.Add(1)
	n := g.running.Add(1)
	defer g.running.Add(-1)
	g.mu.Lock()
	g.mostAtOnce = max(g.mostAtOnce, n)
	g.mu.Unlock()
	<-g.open
	return tools.Preview{Kind: tools.PreviewText, Text: "would count " + c.Args}, nil
}

func (g *gatedPreview) most() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mostAtOnce
}

const hangPolicy = `{
  "version": "hang-1",
  "default_approval": "required",
  "tools": {"echo": {"approval": "never"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// 20 turns of 32 calls to a tool whose previews hang (and ignore their
// context) do not hold up other sessions' turns: echo turns sent while
// they wait on their previews complete with a p99 under 1 s (scaled),
// because a batch's previews run at once and away from the
// executor's workers. The hanging tool never has more than
// PreviewsPerTool previews running, and every hanging turn still gets its
// prompts, with previews that timed out, within about the deadline.
func TestAHangingPreviewDoesNotHoldUpOtherSessions(t *testing.T) {
	hang := newGatedPreview("hang")
	t.Cleanup(func() { close(hang.open) })
	// The deadline outlasts the echo turns below: what they measure is the
	// hanging previews, not the burst of 640 approval records written when
	// the previews time out (the same with or without previews).
	h := pt.Start(t, pt.Options{Policy: hangPolicy, Tools: []tools.Tool{hang}, PreviewDeadline: jstest.Scale(5 * time.Second)})

	calls := make([]schemas.ProposedCall, schemas.MaxCalls)
	for i := range calls {
		calls[i] = pt.Call("hang", fmt.Sprintf(`{"n":%d}`, i))
	}
	var hung []string
	for i := range 20 {
		hung = append(hung, h.Send(h.Inbound(fmt.Sprintf("hang-%d", i), "alice", calls...)))
	}
	// Wait until the executor is on them: the hanging tool is asked.
	jstest.Eventually(t, 10*time.Second, "the hanging previews are asked", func() bool { return hang.asked.Load() > 0 })

	// 30 echo turns of other sessions, one every 100 ms while the hanging
	// turns wait on their previews. A turn's latency
	// runs from when it was sent to when its batch completed (the batch
	// record's time, not when a poll saw it).
	var sent []*schemas.InboundMessage
	for i := range 30 {
		m := h.Inbound(fmt.Sprintf("echo-%d", i), "bob", pt.Call("echo", `{"text":"hi"}`))
		h.Send(m)
		sent = append(sent, m)
		time.Sleep(100 * time.Millisecond) // pacing, not a wait for a result
	}
	var took []time.Duration
	for _, m := range sent {
		b, _ := h.WaitTerminal(schemas.TurnID(m.Transport, m.MessageID))
		if b.State != schemas.BatchCompleted {
			t.Fatalf("echo turn %s ended %s", b.TurnID, b.State)
		}
		took = append(took, b.UpdatedAt.Sub(m.SentAt))
	}
	slices.Sort(took)
	p50, p99 := took[len(took)/2], took[len(took)*99/100-1]
	t.Logf("echo turns: p50 %v, p99 %v, max %v", p50, p99, took[len(took)-1])
	if limit := jstest.Scale(time.Second); p99 > limit {
		t.Errorf("echo turns' p99 %v, want under %v (sorted: %v)", p99, limit, took)
	}
	if n := hang.most(); n > executor.DefaultPreviewsPerTool {
		t.Errorf("%d previews of one tool ran at once, want at most %d", n, executor.DefaultPreviewsPerTool)
	}
	if n := hang.asked.Load(); n > executor.DefaultPreviewsPerTool {
		t.Errorf("the hanging tool was asked %d previews while its %d slots were held, want no more", n, executor.DefaultPreviewsPerTool)
	}
	for _, turn := range hung {
		b := h.WaitState(turn, schemas.BatchAwaiting)
		a := h.Approval(b.Approvals[len(b.Approvals)-1])
		if a.Preview == nil || a.Preview.Status != schemas.PreviewTimedOut {
			t.Fatalf("approval %s preview %+v, want timed_out", a.ApprovalID, a.Preview)
		}
	}
	if hang.Total() != 0 {
		t.Fatalf("the hanging tool ran %d times before any decision", hang.Total())
	}
}

// A turn whose previews are not in yet is given back to the runner (a
// Waiting error, not a failure), and its redeliveries take the previews it
// started instead of asking again; once its approval records are written
// with them, a redelivery after a crash (the batch running again, its
// approvals not listed) reuses the records and asks nothing either. Each
// call's preview is asked exactly once.
func TestARedeliveredTurnDoesNotTakeItsPreviewsAgain(t *testing.T) {
	gated := newGatedPreview("gated")
	h := pt.Start(t, pt.Options{Stages: []string{}, Policy: previewPolicy, Tools: []tools.Tool{gated},
		PreviewDeadline: jstest.Scale(20 * time.Second)})
	ctx := context.Background()
	at := h.Accept(h.Inbound("redeliver", "alice",
		pt.Call("gated", `{"n":1}`), pt.Call("gated", `{"n":2}`), pt.Call("gated", `{"n":3}`)))

	var waiting runner.Waiting
	if err := h.Executor.Accept(ctx, at); !errors.As(err, &waiting) {
		t.Fatalf("first delivery: %v, want a Waiting error while the previews run", err)
	}
	if err := h.Executor.Accept(ctx, at); !errors.As(err, &waiting) || waiting.RetryAfter() <= 0 {
		t.Fatalf("redelivery: %v, want a Waiting error with a delay", err)
	}
	if b := h.Batch(at.TurnID); b.State != schemas.BatchRunning || slices.ContainsFunc(b.Approvals, func(id string) bool { return id != "" }) {
		t.Fatalf("batch %+v, want running with no approval yet", b)
	}
	if n := gated.asked.Load(); n != 3 {
		t.Fatalf("previews asked %d times over two deliveries, want 3 (one per call)", n)
	}

	close(gated.open)
	jstest.Eventually(t, 10*time.Second, "a redelivery writes the approvals", func() bool {
		return h.Executor.Advance(ctx, at.TurnID) == nil
	})
	b := h.Batch(at.TurnID)
	if b.State != schemas.BatchAwaiting {
		t.Fatalf("batch state %s, want awaiting", b.State)
	}
	for _, id := range b.Approvals {
		if p := h.Approval(id).Preview; p == nil || p.Status != schemas.PreviewOK || p.Text == "" {
			t.Fatalf("approval %s preview %+v, want the one taken", id, p)
		}
	}

	// A crash after the records were written, before the batch listed them.
	h.MutateBatch(at.TurnID, func(b *schemas.BatchRecord) {
		b.State = schemas.BatchRunning
		clear(b.Approvals)
	})
	if err := h.Executor.Advance(ctx, at.TurnID); err != nil {
		t.Fatal(err)
	}
	if got := h.Batch(at.TurnID); got.State != schemas.BatchAwaiting || !slices.Equal(got.Approvals, b.Approvals) {
		t.Fatalf("resumed batch %+v, want awaiting on %v", got, b.Approvals)
	}
	if n := gated.asked.Load(); n != 3 {
		t.Fatalf("previews asked %d times in all, want 3 (one per call)", n)
	}
}
