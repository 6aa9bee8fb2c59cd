// Package stagecmd runs one of Tollgate's stages in its own process
// (ingest, executor, approver, redriver, planner): its flags (StageFlags),
// waiting for the broker, the tools and tool providers of a stage that runs
// tools (Tools, Providers), the planner's options (PlannerOptions), and the
// stage itself, built by package tollgate. It stands on the process
// scaffold every binary shares (internal/scaffold); only the stage
// binaries and `tollgate` link it, and with it the composition root, the
// pipeline and the planner's model client.
package stagecmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/mcptool"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// StartupGrace is how long a stage process waits for the broker (connection
// and JetStream) before it gives up and exits, so that stages and the
// broker can be started in any order.
const StartupGrace = 2 * time.Minute

// awaitBroker retries prepare (ensuring or checking the topology) until it
// succeeds, ctx is cancelled, or grace has passed; the last error is
// returned. A definite refusal from the server, or a topology that is not
// provisioned (see refused), is returned at once.
func awaitBroker(ctx context.Context, prepare func(context.Context) error, log *slog.Logger, grace time.Duration) error {
	deadline := time.Now().Add(grace)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := prepare(actx)
		cancel()
		if err == nil || ctx.Err() != nil || refused(err) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker not ready after %v: %w", grace, err)
		}
		log.Warn("waiting for the broker", "err", err, "attempt", attempt+1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(250*time.Millisecond<<min(attempt, 5), 5*time.Second)):
		}
	}
}

// refused reports whether the server answered err with a definite refusal
// (a JetStream API error other than JetStream not being enabled yet, or
// not being available yet while a cluster elects its meta leader), which
// waiting does not change: a stream that exists with another
// configuration, more replicas than the cluster has, a permission the user
// lacks; or whether the topology is not provisioned
// (topology.ErrNotProvisioned), which waiting does not change either.
func refused(err error) bool {
	if errors.Is(err, topology.ErrNotProvisioned) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount,
		jsErrCodeTemporarilyUnavailable:
		return false
	}
	return true
}

// jsErrCodeTemporarilyUnavailable is nats-server's "JetStream system
// temporarily unavailable" (no meta leader yet); nats.go has no constant
// for it. topology.Retry waits on it too.
const jsErrCodeTemporarilyUnavailable jetstream.ErrorCode = 10008

// Tools are the tools of a process that runs the executor or the
// redriver: the built-in echo and write_file (writing inside sandboxDir,
// created if missing) and, when TOLLGATE_LEDGER names a file, the test-only
// ledger tools that internal/chaos counts executions with.
func Tools(sandboxDir string) ([]tools.Tool, error) {
	builtins, err := tools.Builtins(sandboxDir)
	if err != nil {
		return nil, err
	}
	return append(builtins, tools.Ledgers(os.Getenv("TOLLGATE_LEDGER"))...), nil
}

// Providers are the tool providers of a process that runs the executor or
// the redriver, as c asks: NATS tool service discovery on nc (unless
// c.ToolServices is false) and the MCP servers of c.ToolsFile (if set; a
// file that does not load is an error). Their services run with the
// pipeline (tollgate.Pipeline.Run).
func Providers(nc *nats.Conn, c scaffold.Common, log *slog.Logger, reg prometheus.Registerer) ([]tools.Provider, error) {
	var ps []tools.Provider
	if c.ToolServices {
		ps = append(ps, natstool.New(nc, natstool.Options{Logger: log, Registerer: reg}))
	}
	if c.ToolsFile != "" {
		cfg, err := mcptool.LoadConfig(c.ToolsFile)
		if err != nil {
			return nil, err
		}
		ps = append(ps, mcptool.New(cfg, mcptool.Options{Logger: log}))
	}
	return ps, nil
}

// StageFlags is the flag set of a single-stage binary, filling c: the
// common flags (scaffold.Common.Register) and --no-provision (env
// TOLLGATE_NO_PROVISION).
func StageFlags(stage, metricsDefault string, c *scaffold.Common) *flag.FlagSet {
	fs := flag.NewFlagSet(stage, flag.ContinueOnError)
	c.Register(fs, metricsDefault)
	scaffold.BoolVar(fs, &c.NoProvision, "no-provision", "TOLLGATE_NO_PROVISION", false,
		"do not create or update streams, buckets or this stage's consumer: only check that they exist and are compatible, and exit naming what is missing ('tollgate provision' creates them; env TOLLGATE_NO_PROVISION)")
	switch stage {
	case tollgate.StagePlanner:
		c.Planner.Register(fs)
	case tollgate.StageIngest:
		scaffold.BoolVar(fs, &c.PlanText, "plan", "TOLLGATE_PLAN", false, "route messages with text and no calls to the planner, which runs as its own process (env TOLLGATE_PLAN)")
	}
	return fs
}

// metricsAddrs are the stages' default metrics addresses.
var metricsAddrs = map[string]string{
	tollgate.StageIngest: "127.0.0.1:9461", tollgate.StageExecutor: "127.0.0.1:9462",
	tollgate.StageApprover: "127.0.0.1:9463", tollgate.StageRedriver: "127.0.0.1:9464",
	tollgate.StagePlanner: "127.0.0.1:9466",
}

// stageSummaries are the stages' one-line help.
var stageSummaries = map[string]string{
	tollgate.StageIngest:   "the ingest stage: turn transports' messages into accepted turns, each with its TurnContext",
	tollgate.StageExecutor: "the executor stage: run allowed calls, deny denied ones, record an approval for each call that needs a person",
	tollgate.StageApprover: "the approver stage: record people's decisions on approvals (compare-and-set), or reject them with a reason",
	tollgate.StageRedriver: "the redriver stage: resume a batch once every approval in it is decided",
	tollgate.StagePlanner:  "the planner stage: the agent loop that asks a model for the calls of a text-only turn (docs/planner.md)",
}

// Stage is the component that runs one stage in its own process:
// ingest, executor, approver, redriver or planner.
func Stage(stage string) scaffold.Component {
	example := "--nats nats://127.0.0.1:4222 --no-provision"
	if stage == tollgate.StagePlanner {
		example = "--llm-url http://127.0.0.1:11434/v1 --llm-model qwen2.5:7b"
	}
	return scaffold.Component{Name: stage, Summary: stageSummaries[stage], Example: example,
		Main: func(p scaffold.Prog, args []string) int { return Main(p, stage, args) }}
}

// Main runs a single-stage binary invoked as p: parse flags
// (scaffold.Parse), connect, build, run until SIGINT/SIGTERM, drain. It
// returns the process exit code.
func Main(p scaffold.Prog, stage string, args []string) int {
	var c scaffold.Common
	fs := StageFlags(stage, metricsAddrs[stage], &c)
	fs.Init(p.Name, flag.ContinueOnError)
	if exit, ok := scaffold.Parse(fs, p.Help, args); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		return p.Usage("no arguments expected, got %q", fs.Args())
	}
	log := scaffold.Logger(c.LogLevel)
	ctx, cancel := scaffold.SignalContext()
	defer cancel()
	return scaffold.Exit(log, runStage(ctx, stage, c, log))
}

// runStage runs stage, configured by c, until ctx is cancelled.
func runStage(ctx context.Context, stage string, c scaffold.Common, log *slog.Logger) error {
	pol, err := policy.Load(c.PolicyPath)
	if err != nil {
		return err
	}
	keys, err := seal.FromEnv(c.SealKeys)
	if err != nil {
		return err
	}
	proc, err := c.Start(ctx, stage, log, true)
	if err != nil {
		return err
	}
	defer proc.Close()
	nc, js, reg, ready := proc.NC, proc.JS, proc.Reg, proc.Ready
	topo := topology.DefaultConfig()
	topo.Replicas = c.Replicas
	prepare := func(ctx context.Context) error { return topology.Ensure(ctx, js, topo) }
	if c.NoProvision {
		consumers := tollgate.StageConsumers(stage)
		if stage == tollgate.StageIngest && c.PlanText {
			consumers = append(consumers, tollgate.IngestPlanConsumer())
		}
		prepare = func(ctx context.Context) error {
			return topology.Check(ctx, js, topo, consumers)
		}
	}
	if err := awaitBroker(ctx, prepare, log, StartupGrace); err != nil {
		return err
	}
	// Only the executor and the redriver run tools; the other stages need
	// no sandbox directory and no tool providers.
	var ts []tools.Tool
	var ps []tools.Provider
	if stage == tollgate.StageExecutor || stage == tollgate.StageRedriver || stage == tollgate.StagePlanner {
		if ts, err = Tools(c.SandboxDir); err != nil {
			return err
		}
		if ps, err = Providers(nc, c, log, reg); err != nil {
			return err
		}
	}
	plannerOpts, err := PlannerOptions(c.Planner)
	if err != nil {
		return err
	}
	if stage == tollgate.StagePlanner && plannerOpts == nil {
		return errors.New("planner: --llm-url and --llm-model are required")
	}
	p, err := tollgate.New(ctx, tollgate.Config{
		JS: js, Policy: pol, Keys: keys, Tools: ts, Providers: ps, Logger: log, Registerer: reg,
		Instance: scaffold.Instance(), Topology: topo, Stages: []string{stage}, CheckOnly: c.NoProvision, Retention: c.Retention,
		ClaimLease: c.ClaimLease, ToolTimeout: c.ToolTimeout,
		Planner: plannerOpts, PlanText: c.PlanText,
	})
	if err != nil {
		return err
	}
	ready.Add(p.Checks()...)
	log.Info("stage started", "stage", stage, "nats", c.NATSURL, "policy", pol.Version(), "seal_key", keys.Current())
	return p.Run(ctx)
}
