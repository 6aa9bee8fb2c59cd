package natsconf_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// clusterFiles are the three nodes of deploy/nats/cluster-<n>.conf, and
// lpClusterFiles those of its least-privilege variant cluster-lp-<n>.conf.
var (
	clusterFiles   = []string{"cluster-1.conf", "cluster-2.conf", "cluster-3.conf"}
	lpClusterFiles = []string{"cluster-lp-1.conf", "cluster-lp-2.conf", "cluster-lp-3.conf"}
)

// The three cluster files describe one cluster on loopback: one cluster
// name, distinct server names, ports and stores, every node routing to all
// three route listeners, JetStream with sync_interval: always. Then the
// files, with only their listen addresses and stores moved (free ports, a
// temporary directory), form a JetStream cluster that Tollgate's topology
// at three replicas runs on: a turn with an approval goes through, the node
// leading TOLLGATE_TURNS shuts down, and the next turn goes through on the
// other two.
func TestClusterConfig(t *testing.T) {
	opts := loadCluster(t, clusterFiles)
	if t.Failed() || testing.Short() {
		return
	}
	c := jstest.StartClusterOf(t, opts)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := topology.DefaultConfig()
	cfg.Replicas = 3 // --replicas 3
	if err := topology.Ensure(ctx, c.JS[0], cfg); err != nil {
		t.Fatalf("ensure the topology at 3 replicas: %v", err)
	}
	h := pipelinetest.Start(t, pipelinetest.Options{Env: c.Env(t), Wait: wait}) // the package's longer wait (natsconf_test.go)
	turn := func(session string) {
		t.Helper()
		id := h.Send(h.Inbound(session, "alice", pipelinetest.Call("echo", `{"text":"hi"}`), pipelinetest.Call("write_file", `{"path":"a.txt","content":"1"}`)))
		a := h.WaitPending(schemas.ApprovalID(id, 1))
		h.Decide(a.ApprovalID, schemas.OptionApprove, "alice")
		if b, _ := h.WaitTerminal(id); b.State != schemas.BatchCompleted {
			t.Fatalf("turn %s ended %s (%s)", id, b.State, b.Code)
		}
	}
	turn("s-1")
	leader := c.Leader(t, ctx, topology.StreamTurns)
	dead := c.Servers[leader].Name()
	c.Servers[leader].Shutdown()
	c.Servers[leader].WaitForShutdown()
	// The next turn needs every stream and bucket the dead node led to have
	// elected a new leader (a few seconds, longer on a loaded machine);
	// asking before that only measures the election.
	alive := c.JS[(leader+1)%len(c.JS)]
	var groups []string
	for _, sc := range cfg.Streams() {
		groups = append(groups, sc.Name)
	}
	for _, kc := range cfg.Buckets() {
		groups = append(groups, "KV_"+kc.Bucket)
	}
	jstest.Eventually(t, jstest.LongWait, "every stream and bucket led by a live node", func() bool {
		for _, g := range groups {
			ictx, icancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := alive.Stream(ictx, g)
			var info *jetstream.StreamInfo
			if err == nil {
				info, err = s.Info(ictx)
			}
			icancel()
			if err != nil || info.Cluster == nil || info.Cluster.Leader == "" || info.Cluster.Leader == dead {
				return false
			}
		}
		return true
	})
	turn("s-2")
}

// loadCluster loads the three node files as nats-server does and checks
// that they describe one cluster on loopback: one cluster name, distinct
// server names, ports and stores, every node routing to all three route
// listeners, JetStream with sync_interval: always and a 1MB max payload.
func loadCluster(t *testing.T, files []string) []*server.Options {
	t.Helper()
	var opts []*server.Options
	var listens []string
	seen := map[string]string{}
	unique := func(f, what, v string) {
		if other, dup := seen[what+"="+v]; dup {
			t.Errorf("%s and %s share %s %s", other, f, what, v)
		}
		seen[what+"="+v] = f
	}
	for _, f := range files {
		o, err := server.ProcessConfigFile(f)
		if err != nil {
			t.Fatalf("load %s: %v", f, err)
		}
		opts = append(opts, o)
		if !o.JetStream || !o.SyncAlways || o.MaxPayload != 1<<20 {
			t.Errorf("%s: jetstream %v, sync always %v, max payload %d; want JetStream with sync_interval: always and 1MB", f, o.JetStream, o.SyncAlways, o.MaxPayload)
		}
		if o.Host != "127.0.0.1" || o.HTTPHost != "127.0.0.1" || o.Cluster.Host != "127.0.0.1" {
			t.Errorf("%s: listens on %s, http %s, cluster %s; want loopback only", f, o.Host, o.HTTPHost, o.Cluster.Host)
		}
		if o.Cluster.Name != "tollgate" {
			t.Errorf("%s: cluster name %q, want tollgate", f, o.Cluster.Name)
		}
		unique(f, "server_name", o.ServerName)
		unique(f, "client port", fmt.Sprint(o.Port))
		unique(f, "http port", fmt.Sprint(o.HTTPPort))
		unique(f, "cluster port", fmt.Sprint(o.Cluster.Port))
		unique(f, "store_dir", o.StoreDir)
		listens = append(listens, net.JoinHostPort(o.Cluster.Host, fmt.Sprint(o.Cluster.Port)))
	}
	for i, o := range opts {
		var routes []string
		for _, r := range o.Routes {
			routes = append(routes, r.Host)
		}
		slices.Sort(routes)
		if !slices.Equal(routes, slices.Sorted(slices.Values(listens))) {
			t.Errorf("%s routes to %v, want every node's route listener %v", files[i], routes, listens)
		}
	}
	return opts
}

// The least-privilege cluster files describe the same cluster as the plain
// ones, with the accounts of least-privilege.conf on every node. On the
// three nodes, with only their listen addresses and stores moved, admin
// provisions the topology at three replicas, each stage runs in its own
// account as its own user on all three URLs, and a turn with an approval
// from the cli transport goes through with nothing refused; no stage, nor
// the transport, can have an acknowledgement stored on a subject of
// TOLLGATE by naming it as a reply.
func TestClusterLeastPrivilegeConfig(t *testing.T) {
	for user, env := range users {
		t.Setenv(env, password(user))
	}
	opts := loadCluster(t, lpClusterFiles)
	for i, o := range opts {
		if len(o.Accounts) == 0 || len(o.Users) != len(users) {
			t.Errorf("%s: %d accounts, %d users; want least-privilege.conf's %d users", lpClusterFiles[i], len(o.Accounts), len(o.Users), len(users))
		}
	}
	if t.Failed() || testing.Short() {
		return
	}
	// jstest dials the nodes without credentials: let it in as admin.
	for _, o := range opts {
		o.NoAuthUser = "admin"
	}
	c := jstest.StartClusterOf(t, opts)
	topo := topology.DefaultConfig()
	topo.Replicas = 3 // --replicas 3
	admin := dialURL(t, c.URLs(), "admin")
	provisionAs(t, admin, topo)
	stages, _ := runStagesOn(t, c.URLs(), topo, t.TempDir())
	cli := dialURL(t, c.URLs(), "cli")

	turn := send(t, cli, "m-cluster", "s-cluster", schemas.ProposedCall{Tool: "echo", Args: `{"text":"hi"}`},
		schemas.ProposedCall{Tool: "write_file", Args: `{"path":"c.txt","content":"1"}`})
	req := loggedRequest(t, admin, turn)
	d := &schemas.Decision{
		DecisionID: "d-cluster", ApprovalID: req.ApprovalID, Transport: "cli",
		Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true},
		Option:  schemas.OptionApprove, ArgsDigest: req.ArgsDigest, SentAt: time.Now().UTC(),
	}
	publish(t, cli, topology.DecisionSubject("cli", req.ApprovalID), d.DecisionID, d)
	out := loggedOutcome(t, admin, turn)
	if out.State != schemas.TurnCompleted || len(out.Results) != 2 || out.Results[1].Status != schemas.ResultOK {
		t.Fatalf("outcome: %+v", out)
	}

	adminKV, err := topology.OpenBuckets(ctx(t, wait), admin.js)
	if err != nil {
		t.Fatal(err)
	}
	// The turn's batch is in its turn log, which at three replicas allows
	// no direct gets: the stages read it with message gets, and so does
	// the gateway.
	for i, s := range adminKV.TurnLogs {
		if s.CachedInfo().Config.AllowDirect {
			t.Fatalf("%s allows direct gets at three replicas", topology.TurnLogStream(i))
		}
	}
	gw := dialURL(t, c.URLs(), "gateway")
	gwKV, err := topology.OpenBuckets(ctx(t, wait), gw.js)
	if err != nil {
		t.Fatalf("gateway: open the buckets and turn logs: %v (server said %v)", err, gw.reported())
	}
	gwStore := store.New(gwKV)
	eventually(t, "the gateway reads "+turn+" completed from its turn log", func(c context.Context) bool {
		b, _, err := gwStore.Batches.Get(c, turn)
		return err == nil && b.State == schemas.BatchCompleted && !b.Bucketed()
	})
	for _, name := range []string{"ingest", "executor", "approver", "redriver"} {
		t.Run(name+" cannot aim a publish acknowledgement at a KV key or a stream subject", func(t *testing.T) {
			noReplyInjection(t, admin, adminKV, stages[name].client, topology.DLQSubject(name))
		})
	}
	for name, s := range stages {
		if errs := s.reported(); len(errs) > 0 {
			t.Errorf("stage %s was refused: %v", name, errs)
		}
	}
	for _, c := range []*client{cli, gw} {
		if errs := c.reported(); len(errs) > 0 {
			t.Errorf("%s was refused: %v", c.user, errs)
		}
	}
}
