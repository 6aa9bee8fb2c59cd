package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
)

var devCmd = &command{
	name:    "dev",
	summary: "run an embedded nats-server and all four stages in this process (the laptop default; make run)",
	example: "tollgate dev --data ./.tollgate --listen 127.0.0.1:4222",
	run:     cmdDev,
}

// cmdDev runs an embedded nats-server with JetStream (file storage under
// --data) and all four stages in this process, until SIGINT/SIGTERM. It
// holds a lock on --data while it runs (see lockDataDir).
func cmdDev(cmd *command, args []string) int {
	fs := cmd.flags()
	data := fs.String("data", scaffold.Env("TOLLGATE_DATA", "./.tollgate"), "data directory: JetStream store and tool sandbox (env TOLLGATE_DATA)")
	listen := fs.String("listen", scaffold.Env("TOLLGATE_LISTEN", "127.0.0.1:4222"), "loopback address for the embedded nats-server (env TOLLGATE_LISTEN)")
	syncAlways := fs.Bool("sync-always", false, "fsync every JetStream write (sync_interval: always); see docs/operations.md")
	httpAddr := fs.String("http", scaffold.Env("TOLLGATE_HTTP", "127.0.0.1:8080"), "address of the HTTP gateway (docs/api.md), empty to disable (env TOLLGATE_HTTP)")
	discordAddr := fs.String("discord-http", scaffold.Env("TOLLGATE_DISCORD_HTTP", "127.0.0.1:8091"), "address of the Discord interactions endpoint, when TOLLGATE_DISCORD_BOT_TOKEN is set (env TOLLGATE_DISCORD_HTTP; docs/discord.md)")
	webhooks := fs.String("webhooks", scaffold.Env("TOLLGATE_WEBHOOKS", ""), "outgoing webhooks file the HTTP gateway delivers, JSON; empty for none (env TOLLGATE_WEBHOOKS; see docs/api.md)")
	var c scaffold.Common
	c.Register(fs, "127.0.0.1:9460")
	c.Planner.Register(fs)
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) > 0 {
		return cmd.usageError("no arguments expected, got %q", pos)
	}
	plannerOpts, err := stagecmd.PlannerOptions(c.Planner)
	if err != nil {
		return cmd.usageError("%v", err)
	}
	stages := tollgate.AllStages()
	if plannerOpts != nil {
		stages = append(stages, tollgate.StagePlanner)
	}
	log := scaffold.Logger(c.LogLevel)
	host, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate dev: --listen %q: %v\n", *listen, err)
		return 2
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate dev: --listen port %q: %v\n", portStr, err)
		return 2
	}
	sandbox := c.SandboxDir
	if !flagSet(fs, "sandbox") && os.Getenv("TOLLGATE_SANDBOX") == "" {
		sandbox = filepath.Join(*data, "sandbox")
	}
	pol, err := policy.Load(c.PolicyPath)
	if err != nil {
		log.Error("policy", "err", err)
		return 1
	}

	if err := os.MkdirAll(*data, 0o750); err != nil {
		log.Error("data dir", "err", err)
		return 1
	}
	unlock, err := lockDataDir(*data, *listen)
	if err != nil {
		return fail("dev: %v", err)
	}
	defer unlock()
	if err := checkListen(*listen); err != nil {
		return fail("dev: %v", err)
	}
	keys, err := devKeys(c.SealKeys, *data)
	if err != nil {
		log.Error("seal keys", "err", err)
		return 1
	}

	ns, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(*data, "jetstream"), Host: host, Port: port, SyncAlways: *syncAlways})
	if err != nil {
		log.Error("embedded nats-server", "err", err)
		return 1
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	log.Info("embedded nats-server ready", "url", ns.ClientURL(), "store", filepath.Join(*data, "jetstream"), "sync_always", *syncAlways)

	ctx, cancel := scaffold.SignalContext()
	defer cancel()
	stopTracing, err := scaffold.Tracing(ctx, c.OTLP, "tollgate-dev", log)
	if err != nil {
		log.Error("tracing", "err", err)
		return 1
	}
	defer scaffold.FlushTraces(stopTracing, log)
	nc, js, err := scaffold.Connect(ns.ClientURL(), "", "tollgate-dev", log)
	if err != nil {
		log.Error("connect", "err", err)
		return 1
	}
	defer nc.Drain()
	reg := scaffold.NewRegistry()
	ready, err := health.New(reg, stages...)
	if err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	if err := scaffold.ServeMetrics(ctx, c.MetricsAddr, reg, ready, log); err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	topo := topology.DefaultConfig()
	topo.Replicas = c.Replicas
	ts, err := stagecmd.Tools(sandbox)
	if err != nil {
		log.Error("tools", "err", err)
		return 1
	}
	ps, err := stagecmd.Providers(nc, c, log, reg)
	if err != nil {
		log.Error("tools", "err", err)
		return 1
	}
	p, err := tollgate.New(ctx, tollgate.Config{
		JS: js, Policy: pol, Keys: keys, Tools: ts, Providers: ps, Logger: log, Registerer: reg,
		Instance: scaffold.Instance(), Topology: topo, Retention: c.Retention, ClaimLease: c.ClaimLease, ToolTimeout: c.ToolTimeout, Planner: plannerOpts,
	})
	if err != nil {
		log.Error("build stages", "err", err)
		return 1
	}
	ready.Add(p.Checks()...)
	if *httpAddr != "" {
		if err := runDevGateway(ctx, js, pol, keys, *data, *httpAddr, *webhooks, log, reg, cancel); err != nil {
			log.Error("gateway", "err", err)
			return 1
		}
	}
	// The chat transports whose credentials are set (docs/slack.md,
	// docs/discord.md).
	if _, err := startDevChat(ctx, js, *discordAddr, log, cancel); err != nil {
		log.Error("chat transports", "err", err)
		return 1
	}
	log.Info("tollgate dev running", "stages", stages, "nats", ns.ClientURL(), "sandbox", sandbox, "policy", pol.Version())
	fmt.Fprintf(os.Stderr, "\nTollgate is running. In another terminal:\n  tollgate send --session demo --sender alice --call 'write_file={\"path\":\"hello.txt\",\"content\":\"hi\"}'\n  tollgate pending\n\n")
	if plannerOpts != nil {
		fmt.Fprintf(os.Stderr, "The planner asks %s at %s. Chat with it:\n  tollgate chat --session demo --sender alice \"save a note saying buy milk\"\n\n", plannerOpts.Model.Model, plannerOpts.Model.BaseURL)
	}
	if err := p.Run(ctx); err != nil {
		log.Error("stage failed", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// devKeys is the key ring of `tollgate dev`: --seal-keys or the
// environment when set, else <data>/seal-keys.json, created with mode 0600
// on first start so that contexts sealed before a restart still verify.
func devKeys(path, data string) (*seal.KeyRing, error) {
	if path != "" || os.Getenv(seal.EnvKeys) != "" || os.Getenv(seal.EnvKeyFile) != "" {
		return seal.FromEnv(path)
	}
	file := filepath.Join(data, "seal-keys.json")
	r, created, err := seal.EnsureFile(file)
	if err == nil && created {
		fmt.Fprintf(os.Stderr, "created TurnContext seal key %s (mode 0600)\n", file)
	}
	return r, err
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
