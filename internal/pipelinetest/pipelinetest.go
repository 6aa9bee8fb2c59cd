// Package pipelinetest runs Tollgate's four stages in-process against a real
// embedded nats-server (jetstream/jstest) for integration tests, and offers
// helpers to drive them like a transport and a decider would and to observe
// what they stored: KV records, events, dead letters and metrics.
//
// Every wait polls with a deadline; nothing sleeps and hopes. To show that
// something did not happen, wait first for a later fact that proves the
// stage finished (a terminal outcome, a rejection, or the consumer's ack
// floor passing a message with WaitConsumed), then assert the absence.
// Every wait goes through jstest.EventuallyState with the harness's wait
// (default Wait), which TOLLGATE_TEST_TIMEOUT_SCALE stretches.
//
// The files, by role: this one starts the pipeline (Options, Start, H);
// drive.go submits turns and decisions; records.go reads, waits on and
// edits the KV records; streams.go reads and waits on the streams;
// observe.go reads the sandbox and the metrics; fakes.go holds the test
// tools and the tool provider.
package pipelinetest

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/executor"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// Wait is how long a helper polls before failing the test: jstest.Wait,
// stretched like every test deadline by TOLLGATE_TEST_TIMEOUT_SCALE.
const Wait = jstest.Wait

// Stage names, as accepted in Options.Stages.
const (
	Ingest   = tollgate.StageIngest
	Executor = tollgate.StageExecutor
	Approver = tollgate.StageApprover
	Redriver = tollgate.StageRedriver
)

// AllStages in pipeline order.
var AllStages = tollgate.AllStages()

// Options configures Start.
type Options struct {
	// Policy is the policy JSON; "" is policy.DefaultJSON.
	Policy string
	// Stages to run; nil runs all four. Stages not run are still
	// constructed, so their Handle/Apply/Redrive methods can be called
	// directly.
	Stages []string
	// Tools are registered next to the built-in echo and write_file.
	Tools []tools.Tool
	// Providers supply tools from outside the process (tollgate.Config.
	// Providers); a provider that is a tools.Service runs with the stages.
	Providers []tools.Provider
	// ClaimLease and ToolTimeout for the batch engine (default: the
	// engine's defaults; a ClaimLease below a minute needs a ToolTimeout).
	ClaimLease  time.Duration
	ToolTimeout time.Duration
	// Env reuses a running server (e.g. to restart stages); nil starts one.
	Env *jstest.Env
	// SweepInterval and SweepAfter tune the redriver's recovery sweep
	// (default: the redriver package's defaults).
	SweepInterval, SweepAfter time.Duration
	// OrderWait is the executor's session-order wait (default
	// executor.DefaultOrderWait).
	OrderWait time.Duration
	// PreviewDeadline is the executor's preview deadline (default
	// tools.DefaultPreviewDeadline).
	PreviewDeadline time.Duration
	// Wait is how long the helpers of this harness poll before failing the
	// test (default Wait): longer for a three-node cluster whose elections
	// a loaded machine slows down.
	Wait time.Duration
	// Planner, if set, builds the planner stage (tollgate.Config.Planner);
	// name tollgate.StagePlanner in Stages to run it.
	Planner *planner.Options
	// Keys seal and verify TurnContexts; nil is Keys(t), a fresh ring.
	// Pass the previous pipeline's ring when restarting on the same server.
	Keys *seal.KeyRing
	// Retention, when set, is tollgate.Config.Retention, and the streams'
	// max age (which it may not be shorter than) is cut to it.
	Retention time.Duration
}

// Keys returns the test binary's key ring: one random key, "k1", made once
// per process, so that every harness and engine of a test (and a restarted
// pipeline) verify each other's seals. A test of key handling builds its
// own ring with package seal.
// t may be nil (in a fixture built outside a test function).
func Keys(t testing.TB) *seal.KeyRing {
	ringOnce.Do(func() { ring, ringErr = seal.NewFile("k1").Ring() })
	if ringErr != nil {
		if t == nil {
			panic(ringErr)
		}
		t.Fatalf("pipelinetest: keys: %v", ringErr)
	}
	return ring
}

var (
	ringOnce sync.Once
	ring     *seal.KeyRing
	ringErr  error
)

// H is a running pipeline as seen from one test. Use For in a subtest so
// that helpers fail the subtest, not its parent.
type H struct {
	T testing.TB
	*Pipeline
}

// Pipeline is the state shared by every H of one Start.
type Pipeline struct {
	Env      *jstest.Env
	JS       jetstream.JetStream
	Store    *store.Store
	Policy   *policy.Policy
	Keys     *seal.KeyRing
	Sandbox  string
	Registry *prometheus.Registry
	Tools    *tools.Catalog

	// What tollgate.New built: the stages, and the one batch engine of
	// the executor and the redriver.
	Ingest   *ingest.Ingest
	Executor *executor.Executor
	Approver *approver.Approver
	Redriver *redriver.Redriver
	Engine   *batch.Engine
	Planner  *planner.Planner // nil without Options.Planner

	owner   testing.TB
	wait    time.Duration // Options.Wait, or Wait
	built   *tollgate.Pipeline
	running []string // the stages Start runs
	cancel  context.CancelFunc
	done    chan error
	stopped atomic.Bool
	// requests are the decisions sent as requests to the approver
	// (SentDecisions).
	requests *requestLog
}

// seq numbers NextID process-wide, so that pipelines sharing a server
// (restarts) never reuse a message or decision id.
var seq atomic.Int64

// For returns the harness reporting to t (a subtest).
func (h *H) For(t testing.TB) *H { return &H{T: t, Pipeline: h.Pipeline} }

// Logger discards logs unless TOLLGATE_TEST_LOG is set (then: stderr, debug).
func Logger() *slog.Logger {
	if os.Getenv("TOLLGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Start builds the pipeline with tollgate.New (every stage constructed,
// with instance "test", on a fresh or the given embedded server), runs the
// selected stages until the test ends, and returns the harness.
func Start(t testing.TB, o Options) *H {
	t.Helper()
	env := o.Env
	if env == nil {
		env = jstest.Start(t)
	}
	pj := o.Policy
	if pj == "" {
		pj = policy.DefaultJSON
	}
	pol, err := policy.Parse([]byte(pj))
	if err != nil {
		t.Fatalf("pipelinetest: policy: %v", err)
	}
	sandbox := filepath.Join(t.TempDir(), "sandbox")
	builtins, err := tools.Builtins(sandbox)
	if err != nil {
		t.Fatalf("pipelinetest: %v", err)
	}
	keys := o.Keys
	if keys == nil {
		keys = Keys(t)
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(o.Wait, Wait))
	defer cancel()
	topo := env.Topology
	if o.Retention > 0 {
		topo.MaxAge, topo.DuplicateWindow = o.Retention, min(topo.DuplicateWindow, o.Retention)
	}
	p, err := tollgate.New(ctx, tollgate.Config{
		JS: env.JS, Policy: pol, Keys: keys, Tools: append(builtins, o.Tools...), Providers: o.Providers, Logger: Logger(), Registerer: reg,
		Instance: "test", Topology: topo, Retention: o.Retention,
		ClaimLease: o.ClaimLease, ToolTimeout: o.ToolTimeout, OrderWait: o.OrderWait,
		PreviewDeadline: o.PreviewDeadline,
		SweepInterval:   o.SweepInterval, SweepAfter: o.SweepAfter, Planner: o.Planner,
	})
	if err != nil {
		t.Fatalf("pipelinetest: %v", err)
	}
	stages := o.Stages
	if stages == nil {
		stages = AllStages
	}
	for _, s := range stages {
		if !slices.Contains(AllStages, s) && s != tollgate.StagePlanner {
			t.Fatalf("pipelinetest: unknown stage %q", s)
		}
	}
	runCtx, stop := context.WithCancel(context.Background())
	h := &H{T: t, Pipeline: &Pipeline{
		Env: env, JS: env.JS, Store: p.Store, Policy: pol, Keys: keys, Sandbox: sandbox, Registry: reg, Tools: p.Tools,
		Ingest: p.Ingest, Executor: p.Executor, Approver: p.Approver, Redriver: p.Redriver, Engine: p.Engine, Planner: p.Planner,
		owner: t, wait: cmp.Or(o.Wait, Wait), cancel: stop, done: make(chan error, 1),
		built: p, running: slices.Clone(stages),
	}}
	t.Cleanup(h.Stop)
	h.requests = recordDecisionRequests(t, env.JS.Conn())
	go func() { h.done <- p.RunStages(runCtx, stages...) }()
	return h
}

// WaitConsuming waits until every stage Start runs has bound its
// consumers and consumes (the "<stage>/consumer" checks of
// tollgate.Pipeline.Checks pass). Start returns while the stages are
// still starting; a test that looks for a stage's consumer from outside
// (a CLI refusing where no planner runs) waits for this first.
func (h *Pipeline) WaitConsuming() {
	h.owner.Helper()
	var pending []health.Check
	for _, c := range h.built.Checks() {
		if slices.Contains(h.running, c.Stage) && c.Name == c.Stage+"/consumer" {
			pending = append(pending, c)
		}
	}
	jstest.Eventually(h.owner, h.wait, fmt.Sprintf("stages %v consuming", h.running), func() bool {
		for _, c := range pending {
			if c.Check(context.Background()) != nil {
				return false
			}
		}
		return true
	})
}

// Stop stops the running stages and waits for them to drain. It is called
// by t.Cleanup and may be called earlier (e.g. before restarting stages).
func (h *Pipeline) Stop() {
	if h.stopped.Swap(true) {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.owner.Errorf("pipelinetest: %v", err)
		}
	case <-jstest.After(jstest.LongWait):
		h.owner.Errorf("pipelinetest: stages did not stop within %v", jstest.Scale(jstest.LongWait))
	}
}

// Ctx is a context for one helper call.
func (h *Pipeline) Ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}
