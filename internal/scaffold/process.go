package scaffold

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/httpserve"
)

// Component is one of Tollgate's long-running processes (a stage, the
// gateway, a chat transport). The same code runs it as its own binary
// (cmd/ingest: Run("ingest", os.Args[1:])) and as a subcommand of the one
// binary (`tollgate ingest`: Run("tollgate ingest", args)).
type Component struct {
	Name    string // "ingest"
	Args    string // positional arguments for the usage line, if any
	Summary string // one line
	Example string // an example command line, after the program name
	// Main runs the component with the arguments after its name and
	// returns the exit status. It parses its flags with Parse(fs, p.Help,
	// args) before doing anything else, so that -h only prints help.
	Main func(p Prog, args []string) int
}

// Prog is how a component was invoked: Name for its messages and flag
// set ("ingest", "tollgate ingest"), Help for the top of its -h output.
type Prog struct {
	Name string
	Help string
}

// Run runs c as the program prog and returns its exit status.
func (c Component) Run(prog string, args []string) int {
	return c.Main(Prog{Name: prog, Help: c.Help(prog)}, args)
}

// Help is c's help text above its flags, for the program prog: summary,
// usage and example (the layout of every tollgate command's help).
func (c Component) Help(prog string) string {
	usage := strings.Join(strings.Fields(prog+" "+c.Args+" [flags]"), " ")
	return fmt.Sprintf("%s: %s\n\nusage: %s\n\nexample:\n  %s %s\n", prog, c.Summary, usage, prog, c.Example)
}

// FlagSet is the flag set of a component run as p.
func (p Prog) FlagSet() *flag.FlagSet { return flag.NewFlagSet(p.Name, flag.ContinueOnError) }

// Usage reports a wrong use of p on stderr and returns 2.
func (p Prog) Usage(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "%s: %s\nrun '%s -h' for help\n", p.Name, fmt.Sprintf(format, args...), p.Name)
	return 2
}

// Process is a long-running binary's connection to the bus and its
// endpoints, as Common.Start sets them up.
type Process struct {
	Log   *slog.Logger
	NC    *nats.Conn
	JS    jetstream.JetStream
	Reg   *prometheus.Registry // with the Go and process collectors
	Ready *health.Registry     // served on /readyz; add the component's checks
	// stopTracing flushes the trace exporter (a no-op when traces are off).
	stopTracing func(context.Context) error
}

// Start sets up a process called name ("tollgate-"+name on the bus and in
// traces, name as the readiness label) as c configures it: traces when
// trace is set and --otlp or the OTEL_EXPORTER_OTLP_* environment asks for
// them (Tracing); the NATS connection (c.Account.Connect, retrying until
// the broker is up); a metrics registry; the /metrics, /healthz and
// /readyz endpoints on c.MetricsAddr until ctx ends (ServeMetrics).
// Close it when done; on error nothing is left open.
func (c Common) Start(ctx context.Context, name string, log *slog.Logger, trace bool) (_ *Process, err error) {
	p := &Process{Log: log, stopTracing: func(context.Context) error { return nil }}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if trace {
		if p.stopTracing, err = Tracing(ctx, c.OTLP, "tollgate-"+name, log); err != nil {
			return nil, err
		}
	}
	if p.NC, p.JS, err = c.Account.Connect(c.NATSURL, c.Creds, "tollgate-"+name, log, nats.RetryOnFailedConnect(true)); err != nil {
		return nil, err
	}
	p.Reg = NewRegistry()
	if p.Ready, err = health.New(p.Reg, name); err != nil {
		return nil, err
	}
	if err = ServeMetrics(ctx, c.MetricsAddr, p.Reg, p.Ready, log); err != nil {
		return nil, err
	}
	return p, nil
}

// Close drains the NATS connection and flushes the traces not yet
// exported.
func (p *Process) Close() {
	if p.NC != nil {
		_ = p.NC.Drain()
	}
	FlushTraces(p.stopTracing, p.Log)
}

// Exit logs err (unless nil) and returns the exit status a component ends
// with: 0 without an error, 1 with one.
func Exit(log *slog.Logger, err error) int {
	if err == nil {
		return 0
	}
	log.Error("exiting", "err", err)
	return 1
}

// Run runs each actor with a context that ends when ctx does or as soon
// as any actor returns, waits for all of them, and returns the first
// error an actor returned, other than the context's end or
// http.ErrServerClosed: a run group, as each long-running binary runs its
// consumer, its HTTP server and its socket.
func Run(ctx context.Context, actors ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, a := range actors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := a(ctx)
			if errors.Is(err, context.Canceled) || errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			once.Do(func() { first = err })
			cancel()
		}()
	}
	wg.Wait()
	return first
}

// ShutdownGrace is how long an HTTP server gets to finish the requests in
// flight once its process is stopping.
const ShutdownGrace = 5 * time.Second

// ServeHTTP is an actor for Run: it serves h on ln, with the limits of
// package httpserve, until its context ends, then shuts the server down
// within ShutdownGrace.
func ServeHTTP(ln net.Listener, h http.Handler) func(context.Context) error {
	return func(ctx context.Context) error {
		return serveUntil(ctx, httpserve.New(h, httpserve.Limits{}, nil), ln, ShutdownGrace)
	}
}

// serveUntil serves srv on ln until ctx ends, then shuts it down within
// grace and returns once the requests in flight have ended (or grace has
// passed). It returns Serve's error when serving fails first.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-served
	return nil
}
