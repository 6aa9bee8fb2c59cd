package jstest

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Cluster is n embedded nats-servers forming one JetStream cluster on
// loopback, with Tollgate's topology ensured at n replicas.
type Cluster struct {
	Servers []*server.Server
	// NC[i] and JS[i] are a connection to Servers[i] (and, should it go
	// away, to the others); Buckets[i] are the buckets bound through JS[i].
	NC      []*nats.Conn
	JS      []jetstream.JetStream
	Buckets []topology.Buckets
}

// StartCluster starts an n-node cluster (nodes "n1".."n<n>", cluster
// "tollgate-test") with file storage in t.TempDir() and ensures the
// topology with Replicas n. Everything is shut down by t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := StartBareCluster(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := topology.DefaultConfig()
	cfg.Replicas = n
	if err := topology.Ensure(ctx, c.JS[0], cfg); err != nil {
		t.Fatalf("ensure topology with %d replicas: %v", n, err)
	}
	for i, js := range c.JS {
		b, err := topology.OpenBuckets(ctx, js)
		if err != nil {
			t.Fatalf("open buckets on node %d: %v", i+1, err)
		}
		c.Buckets = append(c.Buckets, b)
	}
	return c
}

// StartBareCluster is StartCluster without the topology (Buckets is nil):
// it returns once JetStream answers.
func StartBareCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	var opts []*server.Options
	for i := range n {
		o, err := embedded.Options{
			StoreDir: "set-by-StartClusterOf", Port: -1, ServerName: fmt.Sprintf("n%d", i+1),
			Cluster: &embedded.Cluster{Name: "tollgate-test", Port: -1},
		}.ServerOptions()
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, o)
	}
	return StartClusterOf(t, opts)
}

// StartClusterOf starts one node per element of opts as a cluster on
// loopback and returns once JetStream answers (no topology). Each node
// keeps its server name, cluster name and JetStream settings (sync
// included) from opts, which may come from a configuration file; its
// listeners move to 127.0.0.1 on free ports (client, route; no monitoring
// port), its routes to all the nodes' route ports, its store to
// t.TempDir(). opts are changed in place.
func StartClusterOf(t testing.TB, opts []*server.Options) *Cluster {
	t.Helper()
	var routes []*url.URL
	for _, o := range opts {
		port, err := embedded.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		o.Host, o.Port, o.HTTPHost, o.HTTPPort = "127.0.0.1", -1, "", 0
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", port
		o.StoreDir = filepath.Join(t.TempDir(), o.ServerName)
		o.NoSigs, o.NoLog = true, true
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", port)})
	}
	c := &Cluster{}
	t.Cleanup(func() {
		for _, ns := range c.Servers {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
	})
	for _, o := range opts {
		o.Routes = routes
		ns, err := embedded.RunWithin(o, nil, Ready())
		if err != nil {
			t.Fatalf("start node %s: %v", o.ServerName, err)
		}
		c.Servers = append(c.Servers, ns)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, ns := range c.Servers {
		nc, js := dial(t, ns.ClientURL())
		c.NC, c.JS = append(c.NC, nc), append(c.JS, js)
	}
	// JetStream answers once the nodes have elected a meta leader.
	Eventually(t, LongWait, "the cluster elects a JetStream meta leader", func() bool {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		defer acancel()
		_, err := c.JS[0].AccountInfo(actx)
		return err == nil
	})
	return c
}

// URLs is every node's client URL, comma-separated (a NATS URL list).
func (c *Cluster) URLs() string {
	var urls []string
	for _, ns := range c.Servers {
		urls = append(urls, ns.ClientURL())
	}
	return strings.Join(urls, ",")
}

// Leader returns the index of the node that leads stream.
func (c *Cluster) Leader(t testing.TB, ctx context.Context, stream string) int {
	t.Helper()
	s, err := c.JS[0].Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info := s.CachedInfo()
	if info.Cluster == nil {
		t.Fatalf("stream %s has no cluster info", stream)
	}
	for i, ns := range c.Servers {
		if ns.Name() == info.Cluster.Leader {
			return i
		}
	}
	t.Fatalf("stream %s: leader %q is no node of the cluster", stream, info.Cluster.Leader)
	return -1
}

// Env returns an Env on the cluster, for code written against one server
// (such as pipelinetest.Start): a connection given every node's URL, and
// the buckets bound through it. Server is the first node; Env.Restart does
// not apply. The topology must have been ensured with as many replicas as
// the cluster has nodes (Env.Topology says so).
func (c *Cluster) Env(t testing.TB) *Env {
	t.Helper()
	nc, js := dial(t, c.URLs())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := topology.OpenBuckets(ctx, js)
	if err != nil {
		t.Fatalf("open buckets: %v", err)
	}
	topo := topology.DefaultConfig()
	topo.Replicas = len(c.Servers)
	return &Env{Server: c.Servers[0], NC: nc, JS: js, Buckets: b, Topology: topo}
}

// dial connects to url (reconnecting forever) until the test ends.
func dial(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
