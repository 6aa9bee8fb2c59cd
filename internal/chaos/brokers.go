package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// node is one nats-server of the run: the broker, or one node of a
// cluster. It keeps its ports and store across restarts.
type node struct {
	name        string // server_name
	port        int    // client port on 127.0.0.1
	clusterPort int    // route port; 0 outside a cluster
	conf        string
	slot        *slot
}

func (n *node) addr() string { return net.JoinHostPort("127.0.0.1", itoa(n.port)) }

// clusterName is the name of the harness's cluster.
const clusterName = "tollgate-chaos"

// startBrokers writes the nats-server configurations and starts them: one
// server, or a cluster of ClusterNodes on loopback, and sets h.url to every
// node's URL. A port taken between choosing and binding is retried with
// other ports.
func (h *harness) startBrokers(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := h.tryBrokers(ctx)
		if err == nil {
			for _, n := range h.nodes {
				n.slot.mu.Lock()
				p := n.slot.cur
				n.slot.mu.Unlock()
				go n.slot.supervise(p)
			}
			return nil
		}
		for _, n := range h.nodes {
			n.slot.stop(5 * time.Second)
		}
		if attempt == 3 {
			return err
		}
		h.logf("%v; trying other ports", err)
	}
}

func (h *harness) tryBrokers(ctx context.Context) error {
	h.nodes = nil
	n := h.cfg.ClusterNodes
	for i := 1; i <= n; i++ {
		nd := &node{name: "tollgate-chaos", conf: filepath.Join(h.dir, "nats.conf")}
		slotName := "nats-server"
		if h.cfg.Clustered() {
			nd.name = fmt.Sprintf("tollgate-chaos-%d", i)
			nd.conf = filepath.Join(h.dir, fmt.Sprintf("nats-%d.conf", i))
			slotName = fmt.Sprintf("nats-%d", i)
		}
		var err error
		if nd.port, err = embedded.FreePort(); err != nil {
			return err
		}
		if h.cfg.Clustered() {
			if nd.clusterPort, err = embedded.FreePort(); err != nil {
				return err
			}
		}
		nd.slot = newSlot(h, slotName, "nats-server", "-c", nd.conf)
		h.nodes = append(h.nodes, nd)
	}
	var urls []string
	for _, nd := range h.nodes {
		urls = append(urls, "nats://"+nd.addr())
	}
	h.url = strings.Join(urls, ",")
	// Every route goes through a proxy of the harness, one per dialling
	// node and node dialled (partition.go), so that a node can be cut off
	// from its peers; the nodes do not advertise their own route
	// addresses, which would let them connect around the proxies.
	for _, p := range h.routeProxies {
		p.close()
	}
	h.routeProxies = nil
	routes := map[string][]string{}
	for _, from := range h.nodes {
		for _, to := range h.nodes {
			if from == to || to.clusterPort == 0 {
				continue
			}
			p, err := newRouteProxy(from.name, to.name, net.JoinHostPort("127.0.0.1", itoa(to.clusterPort)))
			if err != nil {
				return err
			}
			h.routeProxies = append(h.routeProxies, p)
			routes[from.name] = append(routes[from.name], p.url())
		}
	}
	for i, nd := range h.nodes {
		store := filepath.Join(h.dir, "jetstream")
		if h.cfg.Clustered() {
			store = filepath.Join(h.dir, fmt.Sprintf("jetstream-%d", i+1))
		}
		if err := writeBrokerConfig(nd, routes[nd.name], store); err != nil {
			return err
		}
	}
	for _, nd := range h.nodes {
		p, err := nd.slot.start()
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = waitTCP(wctx, nd.addr(), p)
		cancel()
		if err != nil {
			return fmt.Errorf("%s did not start: %w\n%s", nd.name, err, tail(p.LogText(), 40))
		}
	}
	return nil
}

// writeBrokerConfig writes nd's configuration in the style of
// deploy/nats/single.conf, or deploy/nats/cluster-<n>.conf in a cluster:
// loopback only, JetStream fsyncing before every acknowledgement (all the
// nodes share one machine), so a SIGKILL of a server loses no acknowledged
// write even on its own.
func writeBrokerConfig(nd *node, routes []string, storeDir string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# written by internal/chaos (deploy/nats settings)\nserver_name: %s\nlisten: %s\nmax_payload: 1MB\n", nd.name, nd.addr())
	if nd.clusterPort != 0 {
		fmt.Fprintf(&b, "cluster {\n  name: %s\n  listen: 127.0.0.1:%d\n  no_advertise: true\n  routes: [\n", clusterName, nd.clusterPort)
		for _, r := range routes {
			fmt.Fprintf(&b, "    %s\n", r)
		}
		b.WriteString("  ]\n}\n")
	}
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", storeDir)
	return os.WriteFile(nd.conf, []byte(b.String()), 0o600)
}

// waitJetStream waits until JetStream answers (in a cluster: once the
// nodes have elected a meta leader).
func (h *harness) waitJetStream(ctx context.Context, js jetstream.JetStream) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("JetStream does not answer: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// streamCluster is a stream's leader and replicas as the meta leader sees
// them.
func streamCluster(ctx context.Context, js jetstream.JetStream, stream string) (*jetstream.ClusterInfo, error) {
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ictx, stream)
	if err != nil {
		return nil, err
	}
	if ci := s.CachedInfo().Cluster; ci != nil {
		return ci, nil
	}
	return nil, fmt.Errorf("stream %s has no cluster information", stream)
}

// poll calls cond every 100ms until it reports done, or until d passes (an
// error, with cond's last error).
func poll(ctx context.Context, d time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	for {
		done, err := cond()
		if done {
			return nil
		}
		if err == nil {
			err = errors.New("not yet")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", d, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// restartBroker SIGKILLs nats-server, or in a cluster the node leading
// TOLLGATE_TURNS, and lets its supervisor start it again on the same ports
// and store after down. It returns once the node accepts connections again
// and, in a cluster, once its replica of TOLLGATE_TURNS has caught up.
func (h *harness) restartBroker(ctx context.Context, js jetstream.JetStream, down time.Duration) error {
	target := h.nodes[0]
	if h.cfg.Clustered() {
		leader, err := turnsLeader(ctx, js, 30*time.Second, "")
		if err != nil {
			return fmt.Errorf("find the %s leader: %w", topology.StreamTurns, err)
		}
		target = nil
		for _, nd := range h.nodes {
			if nd.name == leader {
				target = nd
			}
		}
		if target == nil {
			return fmt.Errorf("%s leader %q is no node of the cluster", topology.StreamTurns, leader)
		}
	}
	h.mu.Lock()
	h.restarts++
	h.lastFault = time.Now()
	h.mu.Unlock()
	killed := time.Now()
	if err := target.slot.kill(ctx, down); err != nil {
		return err
	}
	if h.cfg.Clustered() {
		leader, err := turnsLeader(ctx, js, 60*time.Second, target.name)
		if err != nil {
			h.clusterNote("%s: no new %s leader: %v", target.name, topology.StreamTurns, err)
		} else {
			h.clusterNote("killed %s (leader of %s); %s leads it %v later", target.name, topology.StreamTurns, leader, time.Since(killed).Round(time.Millisecond))
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	p, err := target.slot.waitUp(wctx)
	if err != nil {
		return err
	}
	if err := waitTCP(wctx, target.addr(), p); err != nil {
		return err
	}
	if h.cfg.Clustered() {
		err := poll(ctx, 2*time.Minute, func() (bool, error) {
			ci, err := streamCluster(ctx, js, topology.StreamTurns)
			if err != nil {
				return false, err
			}
			for _, r := range ci.Replicas {
				if r.Name == target.name {
					return r.Current, fmt.Errorf("%s lags by %d operations", r.Name, r.Lag)
				}
			}
			return ci.Leader == target.name, fmt.Errorf("%s is not among the replicas", target.name)
		})
		if err != nil {
			h.clusterNote("%s restarted but its %s replica did not catch up: %v", target.name, topology.StreamTurns, err)
		} else {
			h.clusterNote("%s restarted; its %s replica current %v after the kill", target.name, topology.StreamTurns, time.Since(killed).Round(time.Millisecond))
		}
	}
	return nil
}

// turnsLeader waits up to d for TOLLGATE_TURNS to have a leader other
// than not, and returns its server name.
func turnsLeader(ctx context.Context, js jetstream.JetStream, d time.Duration, not string) (string, error) {
	var leader string
	err := poll(ctx, d, func() (bool, error) {
		ci, err := streamCluster(ctx, js, topology.StreamTurns)
		if err == nil {
			leader = ci.Leader
		}
		return leader != "" && leader != not, err
	})
	return leader, err
}

// clusterNote logs and keeps a remark for the report.
func (h *harness) clusterNote(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.logf("cluster: %s", msg)
	h.mu.Lock()
	h.clusterNotes = append(h.clusterNotes, msg)
	h.mu.Unlock()
}

// topologyStreams are the streams the stages provision: Tollgate's
// streams, its buckets' and its turn logs' (where the batch records are
// kept).
func topologyStreams() []jetstream.StreamConfig {
	cfg := topology.DefaultConfig()
	return slices.Concat(cfg.Streams(), cfg.BucketStreams(), cfg.TurnLogStreams())
}

// checkReplicas notes every stream, bucket or turn log whose replicas are
// not all current (after the run; the cluster should have healed).
func (h *harness) checkReplicas(ctx context.Context, js jetstream.JetStream) {
	if !h.cfg.Clustered() {
		return
	}
	for _, sc := range topologyStreams() {
		err := poll(ctx, 30*time.Second, func() (bool, error) {
			ci, err := streamCluster(ctx, js, sc.Name)
			if err != nil {
				return false, err
			}
			if ci.Leader == "" || len(ci.Replicas) != h.cfg.StreamReplicas-1 {
				return false, fmt.Errorf("leader %q, %d other replicas", ci.Leader, len(ci.Replicas))
			}
			for _, r := range ci.Replicas {
				if !r.Current || r.Offline {
					return false, fmt.Errorf("replica %s current=%v offline=%v lag=%d", r.Name, r.Current, r.Offline, r.Lag)
				}
			}
			return true, nil
		})
		if err != nil {
			h.clusterNote("%s not fully replicated after the run: %v", sc.Name, err)
		}
	}
}

// pauseLeader stops (SIGSTOP) the node leading the busiest of the
// topology's streams, buckets and turn logs (the most messages written), for pause,
// longer than an election, then continues it (SIGCONT) and waits until
// its replica of that stream is current again. Nothing is killed: the
// node keeps its connections, and its clients' requests wait while it is
// stopped; the others elect new leaders of its streams meanwhile, and the
// node comes back believing it still leads. The node is continued
// whatever happens, also when ctx ends first.
func (h *harness) pauseLeader(ctx context.Context, js jetstream.JetStream, pause time.Duration) error {
	stream, leader, err := busiestStream(ctx, js)
	if err != nil {
		return fmt.Errorf("find the busiest stream's leader: %w", err)
	}
	var target *node
	for _, nd := range h.nodes {
		if nd.name == leader {
			target = nd
		}
	}
	if target == nil {
		return fmt.Errorf("%s leader %q is no node of the cluster", stream, leader)
	}
	p, err := target.slot.waitUp(ctx)
	if err != nil {
		return err
	}
	if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stop %s: %w", target.name, err)
	}
	stopped := time.Now()
	h.mu.Lock()
	h.pauses++
	h.lastFault = stopped
	h.mu.Unlock()
	continued := false
	cont := func() {
		if !continued {
			continued = true
			if err := p.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
				h.clusterNote("continue %s: %v", target.name, err)
			}
		}
	}
	defer cont()
	// While it is stopped, the others elect a leader of its stream. The
	// harness's own requests may wait on the stopped node (its connection,
	// or the meta leader, may be that node): what is seen here is a note,
	// not a check.
	var elected string
	_ = poll(ctx, pause, func() (bool, error) {
		ci, err := streamCluster(ctx, js, stream)
		if err == nil && ci.Leader != "" && ci.Leader != leader {
			elected = ci.Leader
		}
		return elected != "", err
	})
	if rest := pause - time.Since(stopped); rest > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(rest):
		}
	}
	cont()
	if elected != "" {
		h.clusterNote("paused %s (leader of %s, the busiest stream) for %v; %s led it while it was stopped", target.name, stream, time.Since(stopped).Round(time.Millisecond), elected)
	} else {
		h.clusterNote("paused %s (leader of %s, the busiest stream) for %v; no other leader was seen while it was stopped", target.name, stream, time.Since(stopped).Round(time.Millisecond))
	}
	var after string // the stream's leader once the node is current again
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		ci, err := streamCluster(ctx, js, stream)
		if err != nil {
			return false, err
		}
		after = ci.Leader
		if ci.Leader == target.name {
			return true, nil
		}
		for _, r := range ci.Replicas {
			if r.Name == target.name {
				return r.Current, fmt.Errorf("%s lags by %d operations", r.Name, r.Lag)
			}
		}
		return false, fmt.Errorf("%s is not among the replicas", target.name)
	})
	if err != nil {
		h.clusterNote("%s continued but its %s replica did not catch up: %v", target.name, stream, err)
	} else {
		h.clusterNote("%s continued; its %s replica current %v after the pause began; %s leads it now", target.name, stream, time.Since(stopped).Round(time.Millisecond), after)
	}
	return nil
}

// busiestStream is the stream (of the topology's streams, buckets and
// turn logs) with the most messages written (its last sequence), and its
// leader.
func busiestStream(ctx context.Context, js jetstream.JetStream) (stream, leader string, err error) {
	var most uint64
	for _, sc := range topologyStreams() {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, serr := js.Stream(ictx, sc.Name)
		cancel()
		if serr != nil {
			err = serr
			continue
		}
		info := s.CachedInfo()
		if info.Cluster == nil || info.Cluster.Leader == "" {
			continue
		}
		if info.State.LastSeq >= most {
			most, stream, leader = info.State.LastSeq, sc.Name, info.Cluster.Leader
		}
	}
	if stream == "" {
		if err == nil {
			err = errors.New("no stream has a leader")
		}
		return "", "", err
	}
	return stream, leader, nil
}
