// Package jstest starts a real embedded nats-server with JetStream for tests:
// file storage in t.TempDir(), a random loopback port, and Tollgate's
// topology already created.
package jstest

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Env is a running server with a client connection and the topology ensured.
type Env struct {
	Server   *server.Server
	StoreDir string
	NC       *nats.Conn
	JS       jetstream.JetStream
	Buckets  topology.Buckets
	// Topology is the configuration the topology was ensured with, for
	// code that ensures it again (tollgate.New).
	Topology topology.Config

	opts embedded.Options // as started, with the port it got; for Restart
}

// Options configures StartWith.
type Options struct {
	// SyncAlways makes the server fsync every JetStream write before
	// acknowledging it (sync_interval: always), the production setting.
	SyncAlways bool
}

// Start starts a server in t.TempDir() and ensures the topology. Everything
// is shut down by t.Cleanup.
func Start(t testing.TB) *Env {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Env {
	t.Helper()
	e := &Env{StoreDir: t.TempDir()}
	e.opts = embedded.Options{StoreDir: e.StoreDir, Port: -1, SyncAlways: o.SyncAlways, ReadyTimeout: Ready()}
	e.start(t)
	// Registered once, here, so that it runs after the cleanups of
	// whatever the test starts on e (stages draining need their server),
	// and shuts down the server running then, restarted or not.
	t.Cleanup(func() { e.Server.Shutdown(); e.Server.WaitForShutdown() })
	e.opts.Port = e.Server.Addr().(*net.TCPAddr).Port
	e.connect(t)
	return e
}

func (e *Env) start(t testing.TB) {
	t.Helper()
	ns, err := embedded.Start(e.opts)
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	e.Server = ns
}

// Restart shuts the server down and starts it again on the same store dir,
// port and options, then waits until the client connection has reconnected
// and JetStream answers. Clients (e.NC, and anything using it) reconnect on
// their own. The shutdown is clean: the server flushes its stores, as it
// does on SIGTERM. Not safe to call concurrently with reads of e.Server.
func (e *Env) Restart(t testing.TB) {
	t.Helper()
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
	e.start(t)
	Eventually(t, Wait, "client reconnected and JetStream answering", func() bool {
		if !e.NC.IsConnected() {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := e.JS.AccountInfo(ctx)
		return err == nil
	})
}

func (e *Env) connect(t testing.TB) {
	t.Helper()
	nc, err := nats.Connect(e.Server.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topo := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, topo); err != nil {
		t.Fatalf("ensure topology: %v", err)
	}
	b, err := topology.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatalf("open buckets: %v", err)
	}
	e.NC, e.JS, e.Buckets, e.Topology = nc, js, b, topo
}

// URL is the server's client URL.
func (e *Env) URL() string { return e.Server.ClientURL() }

// Ctx returns a context cancelled at the end of the test.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// ScaleEnv names the environment variable that stretches every test
// deadline taken through Scale (Eventually, EventuallyState): a number of
// at least 1, such as 3 on a loaded machine. Unset means 1.
const ScaleEnv = "TOLLGATE_TEST_TIMEOUT_SCALE"

// Scale is d multiplied by TOLLGATE_TEST_TIMEOUT_SCALE. A value that is
// not a number of at least 1 panics, naming the variable: a typo must not
// silently shorten or keep every deadline.
func Scale(d time.Duration) time.Duration {
	v := os.Getenv(ScaleEnv)
	if v == "" {
		return d
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 1 || math.IsInf(f, 0) || math.IsNaN(f) {
		panic(fmt.Sprintf("jstest: %s=%q: want a number of at least 1", ScaleEnv, v))
	}
	return time.Duration(float64(d) * f)
}

// Wait is the deadline of an ordinary test wait, the one every poll of
// the tests takes unless it says otherwise: generous for a loaded machine
// under -race, since a passing test returns as soon as its condition
// holds. It is stretched by TOLLGATE_TEST_TIMEOUT_SCALE where it goes
// through Eventually, EventuallyState or Scale.
const Wait = 20 * time.Second

// LongWait is the deadline of a wait that spans a slow step of its own: a
// child process starting, a server restarting under load, a cluster
// electing its leaders, a test's whole load draining. A test that needs
// longer still says so as a multiple of it (2*LongWait), never as a new
// literal.
const LongWait = 3 * Wait

// Ready is how long a test waits for an embedded server it starts to
// accept clients (embedded.Options.ReadyTimeout, embedded.RunWithin):
// LongWait, scaled, since a server recovering its stores on a loaded
// machine under -race can take far longer than production's
// embedded.DefaultReadyTimeout. A server that is ready returns at once.
func Ready() time.Duration { return Scale(LongWait) }

// After is time.After(Scale(d)): the deadline of a test that waits on a
// channel in a select, stretched like every other.
func After(d time.Duration) <-chan time.Time { return time.After(Scale(d)) }

// Eventually polls cond every 10ms until it returns true or Scale(d)
// passes, then fails the test with msg.
func Eventually(t testing.TB, d time.Duration, msg string, cond func() bool) {
	t.Helper()
	EventuallyState(t, d, msg, func() (bool, string) { return cond(), "" })
}

// EventuallyState polls cond every 10ms until it returns true or Scale(d)
// passes, then fails the test with msg and the state cond reported last,
// so that a timeout says what was there instead of only that the wait
// ended ("timed out after 5s: outcome of t-1: last seen: state awaiting").
func EventuallyState(t testing.TB, d time.Duration, msg string, cond func() (ok bool, state string)) {
	t.Helper()
	d = Scale(d)
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				t.Fatalf("timed out after %v: %s: last seen: %s", d, msg, state)
			}
			t.Fatalf("timed out after %v: %s", d, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
