// Package embedded runs an in-process nats-server with JetStream on loopback,
// for `tollgate dev`, tests and benchmarks.
package embedded

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configures an embedded server.
type Options struct {
	// StoreDir is JetStream's file store directory. Required.
	StoreDir string
	// Host defaults to 127.0.0.1. Only loopback addresses are accepted.
	Host string
	// Port is the client port; -1 picks a free one.
	Port int
	// SyncAlways makes JetStream fsync every write (sync_interval: always)
	// instead of every 2 minutes. See docs/operations.md.
	SyncAlways bool
	// ServerName names the server in logs and cluster metadata.
	ServerName string
	// Logger, if set, receives the server's log (debug and trace stay off).
	Logger server.Logger
	// Cluster, if set, makes the server one node of a JetStream cluster
	// (ServerName must then differ between the nodes).
	Cluster *Cluster
	// ReadyTimeout is how long Start waits for the server to accept
	// clients (JetStream's stores recovered, listeners open) before it
	// shuts the server down and fails; 0 means DefaultReadyTimeout.
	// Tests on a loaded machine pass a longer one.
	ReadyTimeout time.Duration
}

// DefaultReadyTimeout is how long Start and Run wait for a server to
// accept clients when no other wait is given.
const DefaultReadyTimeout = 10 * time.Second

// Cluster is one node's cluster settings. Routes are on loopback only.
type Cluster struct {
	// Name is the cluster's name, the same on every node.
	Name string
	// Port is the route listen port on Host; -1 picks a free one.
	Port int
	// Routes are the nodes' route URLs (nats-route://127.0.0.1:<port>); a
	// node's own URL among them is ignored by nats-server.
	Routes []string
}

// Validate reports options Start would reject.
func (o Options) Validate() error {
	if o.StoreDir == "" {
		return errors.New("embedded: StoreDir is required")
	}
	switch o.Host {
	case "", "127.0.0.1", "localhost", "::1":
	default:
		return fmt.Errorf("embedded: host %q is not loopback", o.Host)
	}
	if o.ReadyTimeout < 0 {
		return fmt.Errorf("embedded: ReadyTimeout %v is negative", o.ReadyTimeout)
	}
	if c := o.Cluster; c != nil {
		if c.Name == "" || o.ServerName == "" {
			return errors.New("embedded: a cluster node needs a cluster name and a server name")
		}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil || !loopback(u.Hostname()) {
				return fmt.Errorf("embedded: route %q is not a loopback URL", r)
			}
		}
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Start starts a server and waits, for o.ReadyTimeout, until it accepts
// clients; a server not ready by then is shut down and Start fails. The
// caller must Shutdown it (and may WaitForShutdown).
func Start(o Options) (*server.Server, error) {
	opts, err := o.ServerOptions()
	if err != nil {
		return nil, err
	}
	return RunWithin(opts, o.Logger, o.ReadyTimeout)
}

// ServerOptions are the nats-server options Start runs o with.
func (o Options) ServerOptions() (*server.Options, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	host := o.Host
	if host == "" {
		host = "127.0.0.1"
	}
	name := o.ServerName
	if name == "" {
		name = "tollgate-embedded"
	}
	opts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      o.Logger == nil,
		HTTPPort:   0,
		SyncAlways: o.SyncAlways,
	}
	if c := o.Cluster; c != nil {
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: host, Port: c.Port}
		for _, r := range c.Routes {
			u, _ := url.Parse(r) // checked by Validate
			opts.Routes = append(opts.Routes, u)
		}
	}
	return opts, nil
}

// Run starts a server with opts as they are (callers that take them from
// elsewhere, such as a configuration file, keep them on loopback) and waits
// until it accepts clients, for DefaultReadyTimeout (see RunWithin).
// logger, if not nil, receives its log.
func Run(opts *server.Options, logger server.Logger) (*server.Server, error) {
	return RunWithin(opts, logger, 0)
}

// RunWithin is Run waiting ready (0: DefaultReadyTimeout) for the server
// to accept clients; a server not ready by then is shut down and
// RunWithin fails with an error that says how long it waited.
func RunWithin(opts *server.Options, logger server.Logger, ready time.Duration) (*server.Server, error) {
	if ready <= 0 {
		ready = DefaultReadyTimeout
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: new server: %w", err)
	}
	if logger != nil {
		ns.SetLoggerV2(logger, false, false, false)
	}
	started := make(chan struct{})
	go func() {
		defer close(started)
		ns.Start()
	}()
	if !ns.ReadyForConnections(ready) {
		// Start sets the server up and returns; a Shutdown that overlaps it
		// races with it inside nats-server (the race detector caught one
		// with a 1ns ready timeout), so Shutdown waits for Start, for at
		// most startReturnWait.
		select {
		case <-started:
		case <-time.After(startReturnWait):
		}
		ns.Shutdown()
		return nil, fmt.Errorf("embedded: server not ready within %v", ready)
	}
	return ns, nil
}

// startReturnWait bounds how long RunWithin waits for a server that was
// not ready in time to return from Start before shutting it down.
const startReturnWait = 10 * time.Second

// FreePort is a loopback TCP port that was free a moment ago (for a listener
// whose port others must know before it starts, such as a cluster route, or
// that must come back on the same port after a restart).
//
// It is chosen below the kernel's ephemeral range where that range is known
// (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default),
// not by binding port 0: a port bound with 0 comes from the ephemeral range,
// which every outgoing connection's local port is drawn from too, so between
// FreePort's return and the listener's start a busy machine's connections
// (other tests' clients, a cluster's routes) could take it, and a nats-server
// whose route port is taken never becomes ready. A port below the range is
// taken only by another listener that names it. Elsewhere, or when no port
// there is free after a few tries, it falls back to port 0.
func FreePort() (int, error) {
	if lo, ok := ephemeralLow(); ok && lo > minFreePort+1000 {
		for range 64 {
			port := minFreePort + rand.IntN(lo-minFreePort)
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				continue
			}
			ln.Close()
			return port, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// minFreePort is the lowest port FreePort hands out: above the well-known
// and most registered services' ports.
const minFreePort = 10000

// ephemeralLow is the first port of the kernel's ephemeral range, where
// the kernel says.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	return lo, err == nil
}
