// Package chatcmd is the process of a chat transport (`tollgate slack`,
// `tollgate discord`, cmd/slack, cmd/discord): what every chat platform's
// command shares, as package transport/chat is what their transports
// share. A platform's command (internal/slackcmd, internal/discordcmd)
// supplies only its differences (Platform): its flags, its secrets and
// how it builds its transport; this package parses the common flags,
// connects under the transport's own NATS user, serves metrics and
// health, runs the events consumer with the platform's loops and inbound
// HTTP handler until SIGINT/SIGTERM, and shuts down.
//
// Exit status: 0 after a clean stop or -h; 2 for a wrong use (an unknown
// flag, an argument, a malformed TOLLGATE_* value) or a missing or
// unreadable secret; 1 when connecting, building the transport or
// listening fails, or the transport stops with an error.
//
// Secrets never come from flags and are never logged: each is read from
// the file named by <NAME>_FILE, else from the environment variable
// <NAME> (chat.Secret).
package chatcmd

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
)

// Command is a chat platform's command: its name and help, and the
// platform's part.
type Command struct {
	Name    string // "slack": the subcommand, the NATS user tollgate-<name>, the readiness label
	Summary string // one line of help
	Example string // an example command line
	// MetricsAddr is the default listen address of /metrics, /healthz
	// and /readyz.
	MetricsAddr string
	// Platform returns a fresh platform part for one run (it holds that
	// run's flag values).
	Platform func() Platform
}

// Platform is what differs between chat platforms' commands.
type Platform interface {
	// Flags declares the platform's own flags on fs, each with its
	// TOLLGATE_<NAME>_* environment default. Secrets are never flags.
	Flags(fs *flag.FlagSet)
	// LoadSecrets reads the platform's secrets once the flags are parsed
	// (which ones can depend on them); an error names the variable and
	// exits 2 before anything connects.
	LoadSecrets() error
	// New builds the transport on the process's connection (ctx bounds
	// the binding to its buckets and consumer).
	New(ctx context.Context, d Deps) (Served, error)
}

// Deps is what the process gives a platform's transport.
type Deps struct {
	JS         jetstream.JetStream // the transport's own NATS user
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Transport is a built chat transport as the process runs it.
type Transport interface {
	Run(ctx context.Context) error // the events consumer, until ctx ends
	Ready() error                  // whether the consumer runs (readiness)
	Handler() http.Handler         // the platform's inbound endpoints
}

// Served is a built transport and how to serve it.
type Served struct {
	Transport Transport
	// HTTP is the listen address of Transport.Handler(); "" serves none
	// (Slack in Socket Mode).
	HTTP string
	// Loops run beside the consumer (Slack's Socket Mode connection).
	Loops []func(context.Context) error
	// Log are attributes of the "<name> transport running" line.
	Log []any
}

// BindTimeout bounds building the transport: binding to the pipeline's
// buckets and creating the consumer.
const BindTimeout = 30 * time.Second

// Component is c as one of Tollgate's components.
func (c Command) Component() scaffold.Component {
	return scaffold.Component{Name: c.Name, Summary: c.Summary, Example: c.Example, Main: c.Main}
}

// Main runs the transport invoked as p until SIGINT/SIGTERM and returns
// the exit status.
func (c Command) Main(p scaffold.Prog, args []string) int {
	fs := p.FlagSet()
	var common scaffold.Common
	common.RegisterProcess(fs, c.MetricsAddr)
	pl := c.Platform()
	pl.Flags(fs)
	if exit, ok := scaffold.Parse(fs, p.Help, args); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		return p.Usage("no arguments expected, got %q", fs.Args())
	}
	log := scaffold.Logger(common.LogLevel)
	if err := pl.LoadSecrets(); err != nil {
		log.Error("secrets", "err", err)
		return 2
	}
	ctx, cancel := scaffold.SignalContext()
	defer cancel()
	proc, err := common.Start(ctx, c.Name, log, false)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	defer proc.Close()
	nctx, ncancel := context.WithTimeout(ctx, BindTimeout)
	s, err := pl.New(nctx, Deps{JS: proc.JS, Logger: log, Registerer: proc.Reg})
	ncancel()
	if err != nil {
		log.Error(c.Name, "err", err, "hint", "start Tollgate's stages first: they create the streams and buckets")
		return 1
	}
	tr := s.Transport
	proc.Ready.Add(health.NATS(proc.NC), health.Check{Name: c.Name + "/consumer", Stage: c.Name, Check: func(context.Context) error { return tr.Ready() }})
	actors := append([]func(context.Context) error{tr.Run}, s.Loops...)
	attrs := s.Log
	if s.HTTP != "" {
		ln, err := net.Listen("tcp", s.HTTP)
		if err != nil {
			log.Error("listen", "err", err)
			return 1
		}
		actors = append(actors, scaffold.ServeHTTP(ln, tr.Handler()))
		attrs = append(attrs[:len(attrs):len(attrs)], "addr", ln.Addr().String())
	}
	log.Info(c.Name+" transport running", attrs...)
	return scaffold.Exit(log, scaffold.Run(ctx, actors...))
}
