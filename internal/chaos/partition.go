package chaos

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// routeProxy carries one node's route connections to another node (every
// route of the harness's cluster goes through one, from the dialling node
// to the node dialled, on loopback), so that a node can be cut off from
// its peers while it and its clients keep running: cut closes the
// proxied connections and refuses new ones until it is healed.
type routeProxy struct {
	from, to string // node names: from dials to
	ln       net.Listener
	target   string // to's cluster listen address

	mu     sync.Mutex
	cut    bool
	closed bool
	conns  map[net.Conn]struct{}
}

// newRouteProxy listens on a free loopback port for from's routes to to
// (at target) and serves until close.
func newRouteProxy(from, to, target string) (*routeProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &routeProxy{from: from, to: to, ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// url is the route URL from's configuration names for to.
func (p *routeProxy) url() string { return "nats-route://" + p.ln.Addr().String() }

func (p *routeProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

// pipe joins an accepted connection to a new one to the target, unless
// the proxy is cut.
func (p *routeProxy) pipe(c net.Conn) {
	p.mu.Lock()
	refuse := p.cut || p.closed
	p.mu.Unlock()
	if refuse {
		c.Close()
		return
	}
	t, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, t) {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(t, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, t); done <- struct{}{} }()
	<-done
	c.Close()
	t.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, t)
	p.mu.Unlock()
}

// track registers both ends of a proxied connection, or closes them if
// the proxy was cut meanwhile.
func (p *routeProxy) track(a, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		a.Close()
		b.Close()
		return false
	}
	p.conns[a], p.conns[b] = struct{}{}, struct{}{}
	return true
}

// setCut cuts (closing every proxied connection) or heals the proxy.
func (p *routeProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

func (p *routeProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
}

// partitionNode cuts the node leading the busiest stream off from its
// peers (every route proxy to or from it) for d, then heals the cut and
// waits until that node's replica of the stream is current again. The
// node and its clients keep running: its raft groups lose their quorum
// while the others elect new leaders, and it comes back with a stale
// view. The cut is healed whatever happens, also when ctx ends first.
func (h *harness) partitionNode(ctx context.Context, js jetstream.JetStream, d time.Duration) error {
	stream, leader, err := busiestStream(ctx, js)
	if err != nil {
		return fmt.Errorf("find the busiest stream's leader: %w", err)
	}
	var cut []*routeProxy
	for _, p := range h.routeProxies {
		if p.from == leader || p.to == leader {
			cut = append(cut, p)
		}
	}
	if len(cut) == 0 {
		return fmt.Errorf("no route proxy touches %s", leader)
	}
	for _, p := range cut {
		p.setCut(true)
	}
	started := time.Now()
	h.mu.Lock()
	h.partitions++
	h.lastFault = started
	h.mu.Unlock()
	healed := false
	heal := func() {
		if !healed {
			healed = true
			for _, p := range cut {
				p.setCut(false)
			}
		}
	}
	defer heal()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	heal()
	var after string
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		ci, err := streamCluster(ctx, js, stream)
		if err != nil {
			return false, err
		}
		after = ci.Leader
		if ci.Leader == leader {
			return true, nil
		}
		for _, r := range ci.Replicas {
			if r.Name == leader {
				return r.Current && !r.Offline, fmt.Errorf("%s lags by %d operations", r.Name, r.Lag)
			}
		}
		return false, fmt.Errorf("%s is not among the replicas", leader)
	})
	if err != nil {
		h.clusterNote("%s cut off from its peers (it led %s, the busiest stream) for %v; healed, but its replica did not catch up: %v", leader, stream, d.Round(time.Millisecond), err)
	} else {
		h.clusterNote("%s cut off from its peers (it led %s, the busiest stream) for %v; healed, its replica current %v after the cut began; %s leads it now", leader, stream, d.Round(time.Millisecond), time.Since(started).Round(time.Millisecond), after)
	}
	return nil
}
