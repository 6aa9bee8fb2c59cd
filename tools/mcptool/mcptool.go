// Package mcptool offers the tools of MCP servers as Tollgate tools, so
// that the policy and the approvals govern them like any other tool. It
// uses the official Go SDK (github.com/modelcontextprotocol/go-sdk).
//
// The servers come from a tools file (LoadConfig): commands that speak MCP
// on their stdin and stdout, and streamable-HTTP endpoints. A Provider
// (New) is a tools.Provider and a tools.Service: its Run starts and
// supervises each stdio server (restarted with back-off when it exits),
// connects to each HTTP one (reconnected the same way), lists their tools
// again when a server notifies a change and on an interval, and stops
// everything when its context is cancelled.
//
// A server's tool "t" becomes the Tollgate tool "<server>.t", its name
// lowercased and every character outside [a-z0-9_.-] replaced by "_". Two
// tools of one server that end up with one name are both refused (logged),
// as is a name longer than a tool name may be. Its Spec carries the
// server's description and input schema, Source "mcp:<server>", and the
// readOnlyHint and destructiveHint annotations as Hints. An MCP tool is
// never RetrySafe: a call whose outcome is uncertain is reported for a
// person to check, never re-run on the strength of a server's hint.
//
// A call is a tools/call request with the call's arguments and its call id
// in _meta ("dev.tollgate/call_id"), so that a server can deduplicate. The
// result is the text of its content, joined by newlines (other content is
// described: "[image image/png, 1234 bytes]"); a result with isError is an
// error (the tool ran and failed). A call made while its server is being
// started or connected (Run's first attempt counts as under way from New
// on) waits for it, within the call's context. How a call that got no
// usable result is reported:
//
//   - the server is not connected (waiting to be started again, or not up
//     within the call's context), or the connection was closed before the
//     request was written, or an HTTP server could not be reached:
//     TOOL_UNAVAILABLE, wrapping tools.ErrUnavailable (certainly not run);
//   - the server answered with a JSON-RPC error: an error (it refused or
//     failed the call);
//   - a stdio server sent something that is not a valid reply (not
//     JSON-RPC, a result that is not a tool result): TOOL_REPLY_INVALID,
//     wrapping tools.ErrUncertain; a server whose output cannot be read
//     any more is restarted;
//   - no reply before the call's context ended, the connection was lost
//     after the request was written (the process exited, an HTTP 5xx):
//     EXECUTION_UNCERTAIN, wrapping tools.ErrUncertain.
//
// Library code: nothing is printed; logs (including each stdio server's
// stderr, line by line) go to Options.Logger.
package mcptool

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/tools"
)

// Options tunes a Provider. Zero values are the defaults.
type Options struct {
	// Logger receives the provider's log; nil discards it.
	Logger *slog.Logger
	// ConnectTimeout bounds starting or connecting to a server together
	// with the first listing of its tools, and each later listing.
	// Default 30s.
	ConnectTimeout time.Duration
	// RefreshInterval is how often a connected server's tools are listed
	// again, besides whenever it notifies that they changed. Default 1m.
	RefreshInterval time.Duration
	// RestartMin and RestartMax bound the wait before a server that
	// exited, failed to start or lost its connection is started or
	// connected again: RestartMin first, twice the last wait after each
	// failure, at most RestartMax. A server that stayed up longer than
	// RestartMax starts again from RestartMin. Defaults 1s and 1m.
	RestartMin, RestartMax time.Duration
	// StopGrace is how long a stdio server has to exit once its stdin is
	// closed before it gets SIGTERM, and as long again before SIGKILL.
	// Default 5s.
	StopGrace time.Duration
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.ConnectTimeout, 30*time.Second)
	def(&o.RefreshInterval, time.Minute)
	def(&o.RestartMin, time.Second)
	def(&o.RestartMax, time.Minute)
	def(&o.StopGrace, 5*time.Second)
	o.RestartMax = max(o.RestartMax, o.RestartMin)
	return o
}

// Provider is the tools of the MCP servers of one Config. It implements
// tools.Provider and tools.Service.
type Provider struct {
	servers []*server // sorted by name

	// listed is set once the start-up listing is done or Run has begun;
	// startMu is held while either happens.
	startMu sync.Mutex
	listed  atomic.Bool
	running bool
}

var (
	_ tools.Provider = (*Provider)(nil)
	_ tools.Service  = (*Provider)(nil)
)

// New returns the provider of cfg's servers. It starts nothing: Run
// does, and so does the first call of Tools made before Run (see Tools).
func New(cfg *Config, o Options) *Provider {
	o = o.withDefaults()
	p := &Provider{}
	for _, name := range sortedKeys(cfg.Servers) {
		p.servers = append(p.servers, newServer(name, cfg.Servers[name], o))
	}
	return p
}

// Name implements tools.Provider.
func (p *Provider) Name() string { return "mcp" }

// Tools implements tools.Provider: the tools of every server, as last
// listed, ordered by server. A server that is down keeps its last list (a
// call then gets TOOL_UNAVAILABLE); a server never listed has none.
//
// The first call made before Run lists the servers itself, so that the
// tools are known when the pipeline is built (and a name clash is found
// then): it starts or connects to every server at once, lists its tools
// and stops it again, within ctx and Options.ConnectTimeout. A server that
// cannot be listed then is logged and has no tools until Run lists it.
// Every other call is served from memory. The error is always nil.
func (p *Provider) Tools(ctx context.Context) ([]tools.Tool, error) {
	if !p.listed.Load() {
		p.listAtStart(ctx)
	}
	var out []tools.Tool
	for _, s := range p.servers {
		out = append(out, s.currentTools()...)
	}
	return out, nil
}

// listAtStart lists every server once, unless Run has begun or it has
// been done.
func (p *Provider) listAtStart(ctx context.Context) {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if p.listed.Load() {
		return
	}
	var wg sync.WaitGroup
	for _, s := range p.servers {
		wg.Go(func() { s.listOnce(ctx) })
	}
	wg.Wait()
	p.listed.Store(true)
}

var errRunTwice = errors.New("mcptool: Run called twice")

// Run implements tools.Service: it supervises every server until ctx is
// cancelled, then closes every session, stops every stdio server (see
// Options.StopGrace) and returns nil. Run is called once.
func (p *Provider) Run(ctx context.Context) error {
	p.startMu.Lock()
	if p.running {
		p.startMu.Unlock()
		return errRunTwice
	}
	p.running = true
	p.listed.Store(true)
	p.startMu.Unlock()
	var wg sync.WaitGroup
	for _, s := range p.servers {
		wg.Go(func() { s.supervise(ctx) })
	}
	wg.Wait()
	return nil
}
