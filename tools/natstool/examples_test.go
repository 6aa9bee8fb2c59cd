package natstool_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// example is a tool service example, run as a process of its own.
type example struct {
	tool string // the tool that acts (not retry-safe)
	args string
	want string // its output for alice's turn
	// start runs the example against url until the end of the test;
	// every request it receives is appended to journal; each answer is
	// delayed by delay.
	start func(t *testing.T, url, journal string, delay time.Duration)
}

// startProc runs bin with args in dir, with the example's environment,
// until the end of the test, and logs its output if the test failed.
func startProc(t *testing.T, bin, dir, url, journal string, delay time.Duration, args ...string) {
	t.Helper()
	env := append(childproc.Env(), "NATS_URL="+url, "TOOLSERVICE_JOURNAL="+journal,
		"TOOLSERVICE_DELAY_MS="+strconv.Itoa(int(delay/time.Millisecond)))
	proc, err := childproc.Start(bin, dir, filepath.Join(t.TempDir(), filepath.Base(bin)+".log"), env, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proc.Stop(5 * time.Second)
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(bin), proc.LogText())
		}
	})
}

func TestTheGoExampleThroughThePipeline(t *testing.T) {
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := childproc.Build(ctx, bin, false, "./examples/toolservice-go"); err != nil {
		t.Fatalf("build the example: %v", err)
	}
	runExample(t, example{
		tool: "deploys.deploy", args: `{"service":"api","version":"1.2.3"}`, want: "deployed api 1.2.3 for cli:alice",
		start: func(t *testing.T, url, journal string, delay time.Duration) {
			startProc(t, filepath.Join(bin, "toolservice-go"), t.TempDir(), url, journal, delay)
		},
	})
}

func TestTheNodeExampleThroughThePipeline(t *testing.T) {
	node, dir := nodeExample(t)
	runExample(t, example{
		tool: "tickets.create", args: `{"title":"printer on fire"}`, want: `ticket T-1 "printer on fire" opened for cli:alice`,
		start: func(t *testing.T, url, journal string, delay time.Duration) {
			startProc(t, node, dir, url, journal, delay, "index.js")
		},
	})
}

// nodeExample returns node and the Node example's directory, with its
// dependencies installed (.ci/run runs `npm ci` there). Missing either,
// the test is skipped, or fails on CI (CI=true).
func nodeExample(t *testing.T) (node, dir string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "examples", "toolservice-node"))
	if err != nil {
		t.Fatal(err)
	}
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	if node, err = exec.LookPath("node"); err != nil {
		missing("node is not installed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", "services", "package.json")); err != nil {
		missing("the Node example's dependencies are not installed (run `npm ci` in %s): %v", dir, err)
	}
	return node, dir
}

// runExample runs the example's tool through the pipeline: approved, run
// exactly once and redelivered; and timed out into EXECUTION_UNCERTAIN. It
// also calls it directly, as the engine would, for what the pipeline never
// sends: a repeated call id, and arguments the service refuses.
func runExample(t *testing.T, ex example) {
	t.Run("called directly: a repeated call id gets the first answer, a refused request is the tool's error", func(t *testing.T) {
		env := jstest.Start(t)
		journal := journalFile(filepath.Join(t.TempDir(), "journal"))
		ex.start(t, env.URL(), string(journal), 0)
		var tool tools.Tool
		jstest.Eventually(t, pt.Wait, ex.tool+" offered", func() bool {
			// A fresh provider each time: nothing refreshes one.
			p := natstool.New(env.NC, natstool.Options{Logger: pt.Logger(), DiscoveryWait: discoveryWait})
			ts, err := p.Tools(context.Background())
			for _, tl := range ts {
				if tl.Name() == ex.tool {
					tool = tl
				}
			}
			return err == nil && tool != nil
		})
		call := func(callID, args string) (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return tool.Run(ctx, tools.Call{Context: turnContext(), CallID: callID, Args: args})
		}
		for range 2 {
			if out, err := call("cli:m-1-0", ex.args); err != nil || out != ex.want {
				t.Fatalf("%q, %v; want %q", out, err, ex.want)
			}
		}
		_, err := call("cli:m-1-1", `{}`)
		if err == nil || errors.Is(err, tools.ErrUncertain) || errors.Is(err, tools.ErrUnavailable) || !strings.Contains(err.Error(), "service error 400") {
			t.Fatalf("refused request: %v, want a service error 400", err)
		}
		if n := journal.calls(t, ""); n != 3 {
			t.Fatalf("the service received %d requests, want 3", n)
		}
	})

	t.Run("approved, it runs exactly once, redeliveries included", func(t *testing.T) {
		h, journal := startWithExample(t, ex, 0, pt.Options{})
		turn := h.Send(h.Inbound("s-1", "alice", pt.Call(ex.tool, ex.args)))
		callID := schemas.CallID(turn, 0)
		h.WaitPending(schemas.ApprovalID(turn, 0))
		redeliver(h, turn, false)
		if n := journal.calls(t, ""); n != 0 {
			t.Fatalf("the service received %d requests before the approval", n)
		}
		h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
		b, out := h.WaitTerminal(turn)
		if b.State != schemas.BatchCompleted || len(out.Results) != 1 {
			t.Fatalf("batch %s (%s), %d results", b.State, b.Code, len(out.Results))
		}
		if r := out.Results[0]; r.Status != schemas.ResultOK || r.Output != ex.want {
			t.Fatalf("result %s %s %q (%s), want ok %q", r.Status, r.Code, r.Output, r.Reason, ex.want)
		}
		redeliver(h, turn, true)
		h.WaitIdle(pt.Executor, pt.Redriver)
		if n, all := journal.calls(t, callID), journal.calls(t, ""); n != 1 || all != 1 {
			t.Fatalf("the service received the call %d times (%d requests in all), want once", n, all)
		}
		if n := len(h.Outcomes(turn)); n != 1 {
			t.Fatalf("%d outcomes", n)
		}
		if after := h.Batch(turn); !reflect.DeepEqual(after.Results, b.Results) {
			t.Fatalf("results changed after redelivery: %+v", after.Results)
		}
	})

	t.Run("no reply within the tool timeout is EXECUTION_UNCERTAIN, and the call is not sent again", func(t *testing.T) {
		const toolTimeout = time.Second
		h, journal := startWithExample(t, ex, 4*toolTimeout, pt.Options{ToolTimeout: toolTimeout, ClaimLease: 3 * toolTimeout})
		turn := h.Send(h.Inbound("s-1", "alice", pt.Call(ex.tool, ex.args)))
		h.WaitPending(schemas.ApprovalID(turn, 0))
		h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
		b, out := h.WaitTerminal(turn)
		if r := out.Results[0]; b.State != schemas.BatchCompleted || r.Status != schemas.ResultNeedsAttention || r.Code != schemas.CodeExecutionUncertain {
			t.Fatalf("batch %s, result %s %s (%s), want needs_attention %s", b.State, r.Status, r.Code, r.Reason, schemas.CodeExecutionUncertain)
		}
		// A redelivery finds the recorded result: nothing is sent again.
		redeliver(h, turn, true)
		h.WaitIdle(pt.Executor, pt.Redriver)
		if n := journal.calls(t, ""); n != 1 {
			t.Fatalf("the service received %d requests, want 1", n)
		}
		if after := h.Batch(turn); !reflect.DeepEqual(after.Results, b.Results) {
			t.Fatalf("results changed after redelivery: %+v", after.Results)
		}
	})
}

// startWithExample starts a server, the example against it and a pipeline
// with the NATS tool provider, and waits until the provider offers the
// example's tool.
func startWithExample(t *testing.T, ex example, delay time.Duration, o pt.Options) (*pt.H, journalFile) {
	t.Helper()
	env := jstest.Start(t)
	journal := journalFile(filepath.Join(t.TempDir(), "journal"))
	ex.start(t, env.URL(), string(journal), delay)
	p := natstool.New(env.NC, natstool.Options{Logger: pt.Logger(), DiscoveryWait: discoveryWait, RefreshInterval: stable, MinRefreshGap: refreshGap})
	o.Env, o.Providers = env, []tools.Provider{p}
	h := pt.Start(t, o)
	discoverUntil(t, p, ex.tool+" offered", func(m map[string]tools.Spec) bool { _, ok := m[ex.tool]; return ok })
	return h, journal
}

// redeliver publishes again, under fresh message ids, the turn's accepted
// message and (if decided) its decided event, as a redelivery would, and
// waits until the stages have handled them.
func redeliver(h *pt.H, turn string, decided bool) {
	h.T.Helper()
	var accepted []pt.Stored
	for _, m := range h.Messages(topology.StreamTurns, topology.SubjectTurnOrder+">") {
		if at, err := schemas.Decode[schemas.AcceptedTurn](m.Data); err == nil && at.TurnID == turn {
			accepted = append(accepted, m)
		}
	}
	if len(accepted) == 0 {
		h.T.Fatalf("no accepted message of %s stored", turn)
	}
	h.WaitConsumed(pt.Executor, h.PublishRaw(accepted[0].Subject, h.NextID("again"), accepted[0].Data, nil))
	if !decided {
		return
	}
	// The decision heard again: its record written again as it is (a new
	// revision of the same decided record).
	decisions := h.Decisions(turn)
	if len(decisions) == 0 {
		h.T.Fatalf("no decision of %s stored", turn)
	}
	h.MutateApproval(decisions[0].ApprovalID, func(*schemas.ApprovalRecord) {})
	h.WaitIdle(pt.Redriver)
}

// journalFile is where an example appends "<tool> <call id>" for each
// request it receives.
type journalFile string

// calls counts the requests for callID ("" for all).
func (j journalFile) calls(t *testing.T, callID string) int {
	t.Helper()
	b, err := os.ReadFile(string(j))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if _, id, _ := strings.Cut(strings.TrimSpace(line), " "); callID == "" || id == callID {
			n++
		}
	}
	return n
}
