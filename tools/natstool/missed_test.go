package natstool_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// stallProxy is a loopback TCP proxy in front of env's server whose
// client-to-server direction can be held: a service connected through it
// stays connected and subscribed (the server still routes requests to it)
// while nothing it sends arrives, as a process too loaded to answer in
// time would be.
type stallProxy struct {
	addr string
	mu   sync.Mutex
	cond *sync.Cond
	held bool
}

func newStallProxy(t *testing.T, env *jstest.Env) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{addr: ln.Addr().String()}
	p.cond = sync.NewCond(&p.mu)
	target := strings.TrimPrefix(env.URL(), "nats://")
	var conns []net.Conn
	var cmu sync.Mutex
	t.Cleanup(func() {
		_ = ln.Close()
		p.hold(false)
		cmu.Lock()
		defer cmu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			cmu.Lock()
			conns = append(conns, c, s)
			cmu.Unlock()
			go func() { _, _ = io.Copy(c, s); _ = c.Close() }()
			go func() { _, _ = io.Copy(gated{p, s}, c); _ = s.Close() }()
		}
	}()
	return p
}

// hold holds (true) or releases (false) what clients send.
func (p *stallProxy) hold(on bool) {
	p.mu.Lock()
	p.held = on
	p.mu.Unlock()
	p.cond.Broadcast()
}

// gated writes to w once the proxy is not held.
type gated struct {
	p *stallProxy
	w io.Writer
}

func (g gated) Write(b []byte) (int, error) {
	g.p.mu.Lock()
	for g.p.held {
		g.p.cond.Wait()
	}
	g.p.mu.Unlock()
	return g.w.Write(b)
}

// round runs one discovery round on p (a provider whose tools change only
// by Refresh) and reports whether it offers tool.
func round(t *testing.T, p *natstool.Provider, tool string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), jstest.Scale(jstest.Wait))
	defer cancel()
	if err := p.Refresh(ctx); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	_, ok := specs(t, p)[tool]
	return ok
}

func TestAToolLeavesOnlyAfterItsServiceMissedSeveralRounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		missed int // Options.MissedRounds
		stays  int // rounds missed that still offer the tool
	}{
		{"by default a tool stays through two missed rounds and leaves at the third", 0, 2},
		{"with MissedRounds 1 a tool leaves at the first round that misses its service", 1, 0},
		{"with MissedRounds 5 a tool stays through four missed rounds", 5, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := jstest.Start(t)
			proxy := newStallProxy(t, env)
			nc, err := nats.Connect("nats://" + proxy.addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			addService(t, nc, "loaded", endpoint{name: "tool"})
			p := newProvider(env, natstool.Options{RefreshInterval: stable, MinRefreshGap: refreshGap, MissedRounds: tc.missed})
			discoverUntil(t, p, "loaded.tool offered", offered("loaded.tool"))

			// The service is still subscribed but its answers no longer
			// arrive: every round misses it, and its ping times out.
			proxy.hold(true)
			for i := 1; i <= tc.stays; i++ {
				if !round(t, p, "loaded.tool") {
					t.Fatalf("loaded.tool left after %d missed round(s), want it offered through %d", i, tc.stays)
				}
			}
			if round(t, p, "loaded.tool") {
				t.Fatalf("loaded.tool still offered after %d missed rounds", tc.stays+1)
			}

			// Heard again, it is back.
			proxy.hold(false)
			discoverUntil(t, p, "loaded.tool offered again once its service answers", offered("loaded.tool"))
		})
	}
}

// The service protocol has no goodbye; a stopped service's ping has no
// responders, which takes its tools away at the first round that misses
// it, whatever MissedRounds is.
func TestAToolWhoseServiceStoppedLeavesAtTheFirstMissedRound(t *testing.T) {
	env := jstest.Start(t)
	svcNC := connect(t, env)
	svc := addService(t, svcNC, "stopping", endpoint{name: "tool"})
	addService(t, connect(t, env), "staying", endpoint{name: "tool"})
	p := newProvider(env, natstool.Options{RefreshInterval: stable, MinRefreshGap: refreshGap, MissedRounds: 100})
	discoverUntil(t, p, "both tools offered", func(m map[string]tools.Spec) bool {
		return offered("stopping.tool")(m) && offered("staying.tool")(m)
	})
	if err := svc.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := svcNC.Flush(); err != nil { // the server has dropped its subscriptions
		t.Fatal(err)
	}
	if round(t, p, "stopping.tool") {
		t.Fatal("stopping.tool still offered after a round that missed its stopped service")
	}
	// A service that runs on stays (heard again, or kept by a missed round).
	if !round(t, p, "staying.tool") {
		t.Fatal("staying.tool left with the stopped service")
	}
}
