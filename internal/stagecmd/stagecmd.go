// Package stagecmd is what Tollgate's binaries share around the stages:
// flags with TOLLGATE_* environment defaults, the NATS connection, waiting
// for the broker, the metrics and health endpoints (/metrics, /healthz,
// /readyz), logging, and the tools a stage
// process registers. The stages themselves are built by package tollgate.
// It keeps every main package thin.
package stagecmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/mcptool"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// DefaultNATSURL is where `tollgate dev` listens.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// Common holds the settings every stage binary takes.
type Common struct {
	NATSURL     string
	Creds       string
	MetricsAddr string
	LogLevel    string
	Replicas    int
	PolicyPath  string
	SandboxDir  string
	// SealKeys is the key file path; empty means TOLLGATE_SEAL_KEYS
	// (inline JSON) or TOLLGATE_SEAL_KEY_FILE (see seal.FromEnv).
	SealKeys string
	// ToolServices: discover NATS tool services on the bus and offer their
	// tools (tools/natstool). On by default.
	ToolServices bool
	// ToolsFile is a tools file naming MCP servers whose tools to offer
	// (tools/mcptool); empty for none.
	ToolsFile string
	// OTLP is where traces are exported (--otlp; see Tracing); empty:
	// only where the OTEL_EXPORTER_OTLP_* environment names an endpoint.
	OTLP string
	// Account is where the connection lives when the process has a NATS
	// account of its own (deploy/nats/least-privilege.conf).
	Account Account
	// NoProvision: a stage binary only checks that the topology exists and
	// is compatible (tollgate.Config.CheckOnly) and exits with an error
	// naming what is missing or different, instead of creating or updating
	// it. Off by default (the laptop default); the Helm chart turns it on.
	NoProvision bool
	// Planner: the planner stage's settings (only its binary has them);
	// PlanText: ingest routes text-only turns to the planner (--plan).
	Planner  PlannerFlags
	PlanText bool
	// Retention is how long ended records stay in KV
	// (tollgate.Config.Retention); zero is the default, 30 days.
	Retention time.Duration
	// ClaimLease and ToolTimeout are batch.Config's (how long a claimed
	// call without a result holds its call before it is reported
	// uncertain; how long one tool run may take, below the lease); zero
	// is the default (2m, 1m).
	ClaimLease, ToolTimeout time.Duration
	// GroupCommit: the stages' writes that wait at the same time on one
	// stream are committed as one atomic batch (tollgate.Config's
	// NoGroupCommit is its negation). Off by default in the binaries
	// (--group-commit turns it on): measured, it does not yet pay at the
	// default flush mode (docs/operations.md, "Group commit").
	GroupCommit bool
}

// Register adds the common flags to fs with defaults from TOLLGATE_*
// variables (a malformed one is refused by Parse: see EnvErr);
// metricsDefault is the stage's default metrics address.
func (c *Common) Register(fs *flag.FlagSet, metricsDefault string) {
	c.RegisterProcess(fs, metricsDefault)
	IntVar(fs, &c.Replicas, "replicas", "TOLLGATE_REPLICAS", 1, "replicas for streams and buckets (env TOLLGATE_REPLICAS)")
	StringVar(fs, &c.PolicyPath, "policy", "TOLLGATE_POLICY", "", "policy JSON file; empty for the built-in policy (env TOLLGATE_POLICY)")
	fs.StringVar(&c.SealKeys, "seal-keys", "", "TurnContext seal key file (default: env TOLLGATE_SEAL_KEYS inline JSON, else env TOLLGATE_SEAL_KEY_FILE)")
	StringVar(fs, &c.SandboxDir, "sandbox", "TOLLGATE_SANDBOX", "./.tollgate/sandbox", "directory write_file writes into (env TOLLGATE_SANDBOX)")
	BoolVar(fs, &c.ToolServices, "tool-services", "TOLLGATE_TOOL_SERVICES", true,
		"discover NATS tool services on the bus and offer their tools; --tool-services=false turns it off (env TOLLGATE_TOOL_SERVICES)")
	DurationVar(fs, &c.Retention, "retention", "TOLLGATE_RETENTION", 0,
		"how long ended turns' records stay in KV, at least the streams' max age (720h); 0 for 720h, negative to keep them (env TOLLGATE_RETENTION)")
	DurationVar(fs, &c.ClaimLease, "claim-lease", "TOLLGATE_CLAIM_LEASE", 0,
		"how long a claimed call with no recorded result is held before it is reported uncertain and never run again; 0 for 2m (env TOLLGATE_CLAIM_LEASE)")
	DurationVar(fs, &c.ToolTimeout, "tool-timeout", "TOLLGATE_TOOL_TIMEOUT", 0,
		"how long one tool run may take, below the claim lease; 0 for 1m (env TOLLGATE_TOOL_TIMEOUT)")
	BoolVar(fs, &c.GroupCommit, "group-commit", "TOLLGATE_GROUP_COMMIT", false,
		"commit the writes that wait at the same time on one stream as one atomic batch (off: each write alone; docs/operations.md, Group commit) (env TOLLGATE_GROUP_COMMIT)")
	StringVar(fs, &c.ToolsFile, "tools", "TOLLGATE_TOOLS", "", "tools file naming MCP servers whose tools to offer (docs/tools.md); empty for none (env TOLLGATE_TOOLS)")
	OTLPFlag(fs, &c.OTLP)
}

// RegisterProcess adds the flags every long-running binary takes (the
// stages, the gateway, the chat transports) to fs: --nats, --creds,
// --inbox-prefix and --js-api-prefix (Account), --log-level and
// --metrics (default metricsDefault), each with its TOLLGATE_* default.
func (c *Common) RegisterProcess(fs *flag.FlagSet, metricsDefault string) {
	StringVar(fs, &c.NATSURL, "nats", "TOLLGATE_NATS_URL", DefaultNATSURL, "NATS URL (env TOLLGATE_NATS_URL)")
	StringVar(fs, &c.Creds, "creds", "TOLLGATE_NATS_CREDS", "", "NATS credentials file of this process's user (env TOLLGATE_NATS_CREDS)")
	StringVar(fs, &c.MetricsAddr, "metrics", "TOLLGATE_METRICS_ADDR", metricsDefault, "address for /metrics, /healthz and /readyz, empty to disable (env TOLLGATE_METRICS_ADDR)")
	LevelVar(fs, &c.LogLevel, "log-level", "TOLLGATE_LOG_LEVEL", "debug, info, warn or error (env TOLLGATE_LOG_LEVEL)")
	c.Account.Register(fs)
}

// Logger returns a text logger on stderr at level.
func Logger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// SignalContext is cancelled on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// Account is how a process reaches the bus from a NATS account of its own
// that holds no streams (deploy/nats/least-privilege.conf): its reply
// subjects start with InboxPrefix, which the account holding the streams
// exports back to it alone (a KV watch's deliveries are published there),
// and it reaches that account's JetStream API under APIPrefix, where its
// own account imports it. The zero value is a process in the account that
// holds the streams: _INBOX and $JS.API.
type Account struct {
	InboxPrefix string
	APIPrefix   string
}

// Register adds --inbox-prefix and --js-api-prefix to fs, with defaults
// from TOLLGATE_INBOX_PREFIX and TOLLGATE_JS_API_PREFIX.
func (a *Account) Register(fs *flag.FlagSet) {
	StringVar(fs, &a.InboxPrefix, "inbox-prefix", "TOLLGATE_INBOX_PREFIX", "_INBOX",
		"prefix of this connection's reply subjects, e.g. _INBOX_executor in its own NATS account (env TOLLGATE_INBOX_PREFIX)")
	StringVar(fs, &a.APIPrefix, "js-api-prefix", "TOLLGATE_JS_API_PREFIX", "$JS.API",
		"where this account reaches the JetStream API, e.g. JS.TOLLGATE.API when it imports another account's (env TOLLGATE_JS_API_PREFIX)")
}

// Connect dials NATS as Connect does, with a's inbox prefix, and returns a
// JetStream handle on a's API prefix.
func (a Account) Connect(url, creds, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	if a.InboxPrefix != "" {
		extra = append(extra, nats.CustomInboxPrefix(a.InboxPrefix))
	}
	nc, js, err := Connect(url, creds, name, log, extra...)
	if err != nil || a.APIPrefix == "" {
		return nc, js, err
	}
	if js, err = jetstream.NewWithAPIPrefix(nc, a.APIPrefix); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Connect dials NATS (reconnecting forever) and returns a JetStream handle.
//
// Extra options are appended; a stage passes nats.RetryOnFailedConnect so
// that it can start while the broker is still down (awaitBroker then waits
// for it). Asynchronous errors (a permission violation, a slow consumer)
// are logged, since they otherwise surface only as timeouts.
func Connect(url, creds, name string, log *slog.Logger, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Warn("nats async error", "err", err, "subject", sub.Subject)
				return
			}
			log.Warn("nats async error", "err", err)
		}),
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("nats reconnected", "url", nc.ConnectedUrl()) }),
	}
	if creds != "" {
		opts = append(opts, nats.UserCredentials(creds))
	}
	opts = append(opts, extra...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

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

// ServeMetrics serves, on addr until ctx is cancelled: reg on /metrics;
// /healthz, 200 while the process runs; and /readyz, ready's Report as
// JSON, 200 when ready and 503 when not (see package health). An empty
// addr serves nothing.
func ServeMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready *health.Registry, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", health.Alive)
	mux.Handle("/readyz", ready)
	go func() {
		if err := serveUntil(ctx, httpserve.New(mux, httpserve.Limits{}, nil), ln, 2*time.Second); err != nil {
			log.Warn("metrics server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return nil
}

// NewRegistry is a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

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
func Providers(nc *nats.Conn, c Common, log *slog.Logger, reg prometheus.Registerer) ([]tools.Provider, error) {
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

// Instance is "hostname:pid".
func Instance() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}

// StageFlags is the flag set of a single-stage binary, filling c: the
// common flags (Common.Register) and --no-provision (env
// TOLLGATE_NO_PROVISION).
func StageFlags(stage, metricsDefault string, c *Common) *flag.FlagSet {
	fs := flag.NewFlagSet(stage, flag.ContinueOnError)
	c.Register(fs, metricsDefault)
	BoolVar(fs, &c.NoProvision, "no-provision", "TOLLGATE_NO_PROVISION", false,
		"do not create or update streams, buckets or this stage's consumer: only check that they exist and are compatible, and exit naming what is missing ('tollgate provision' creates them; env TOLLGATE_NO_PROVISION)")
	switch stage {
	case tollgate.StagePlanner:
		c.Planner.Register(fs)
	case tollgate.StageIngest:
		BoolVar(fs, &c.PlanText, "plan", "TOLLGATE_PLAN", false, "route messages with text and no calls to the planner, which runs as its own process (env TOLLGATE_PLAN)")
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
func Stage(stage string) Component {
	example := "--nats nats://127.0.0.1:4222 --no-provision"
	if stage == tollgate.StagePlanner {
		example = "--llm-url http://127.0.0.1:11434/v1 --llm-model qwen2.5:7b"
	}
	return Component{Name: stage, Summary: stageSummaries[stage], Example: example,
		Main: func(p Prog, args []string) int { return Main(p, stage, args) }}
}

// Main runs a single-stage binary invoked as p: parse flags (Parse),
// connect, build, run until SIGINT/SIGTERM, drain. It returns the process
// exit code.
func Main(p Prog, stage string, args []string) int {
	var c Common
	fs := StageFlags(stage, metricsAddrs[stage], &c)
	fs.Init(p.Name, flag.ContinueOnError)
	if exit, ok := Parse(fs, p.Help, args); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		return p.Usage("no arguments expected, got %q", fs.Args())
	}
	log := Logger(c.LogLevel)
	ctx, cancel := SignalContext()
	defer cancel()
	return Exit(log, runStage(ctx, stage, c, log))
}

// runStage runs stage, configured by c, until ctx is cancelled.
func runStage(ctx context.Context, stage string, c Common, log *slog.Logger) error {
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
	plannerOpts, err := c.Planner.Options()
	if err != nil {
		return err
	}
	if stage == tollgate.StagePlanner && plannerOpts == nil {
		return errors.New("planner: --llm-url and --llm-model are required")
	}
	p, err := tollgate.New(ctx, tollgate.Config{
		JS: js, Policy: pol, Keys: keys, Tools: ts, Providers: ps, Logger: log, Registerer: reg,
		Instance: Instance(), Topology: topo, Stages: []string{stage}, CheckOnly: c.NoProvision, Retention: c.Retention,
		ClaimLease: c.ClaimLease, ToolTimeout: c.ToolTimeout, NoGroupCommit: !c.GroupCommit,
		Planner: plannerOpts, PlanText: c.PlanText,
	})
	if err != nil {
		return err
	}
	ready.Add(p.Checks()...)
	log.Info("stage started", "stage", stage, "nats", c.NATSURL, "policy", pol.Version(), "seal_key", keys.Current())
	return p.Run(ctx)
}
