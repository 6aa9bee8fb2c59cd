// Package scaffold is the contract of the process scaffold every Tollgate
// binary shares (the stages, the gateway, the chat transports, the one
// tollgate binary): flags with TOLLGATE_* environment defaults, refused at
// start with exit status 2 when malformed (Parse, EnvErr, the typed *Var
// readers); a component's help and usage (Component, Prog); the NATS
// connection, in an account of its own or not (Connect, Account); the
// metrics registry and the /metrics, /healthz and /readyz endpoints
// (NewRegistry, ServeMetrics); logging, signals, traces (Logger,
// SignalContext, Tracing); and the run group a long-running binary runs its
// actors in (Run, ServeHTTP, Exit). It keeps every main package thin.
//
// It links neither the composition root (package tollgate), nor the
// pipeline's packages, nor the tools (layers_test.go checks it): running a
// stage, with its tools and the planner's model client, is
// internal/stagecmd's, so that a binary that runs no stage (the gateway,
// slack, discord) does not link them.
//
// Common holds the stage binaries' settings too (policy, sandbox, tool
// providers, planner flags, retention, leases): they are plain values
// (strings, numbers, durations), registered as flags here, so that one
// struct is what `tollgate dev`, the stage binaries and the deploy tests
// parse, and the gateway can share the --policy and --otlp flags; what
// turns them into a stage (policy.Load, the tool providers, the planner's
// options) lives in internal/stagecmd.
package scaffold

import (
	"context"
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

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/httpserve"
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
// that it can start while the broker is still down (internal/stagecmd then
// waits for it). Asynchronous errors (a permission violation, a slow consumer)
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

// Instance is "hostname:pid".
func Instance() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}
