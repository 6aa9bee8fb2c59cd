package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
)

// storage is how a run's servers store what they acknowledge: Sync is
// sync_interval: always (an fsync before every acknowledgement) instead of
// nats-server's 2-minute flush, and Nodes is 1 (one server, R1) or the
// size of a cluster on loopback whose streams and buckets have Nodes
// replicas.
type storage struct {
	Sync  bool
	Nodes int
}

var (
	single       = storage{Nodes: 1}
	singleSynced = storage{Sync: true, Nodes: 1}
)

// String is the figures' sync label: "default" or "always", with " R<n>"
// for a cluster.
func (s storage) String() string {
	name := "default"
	if s.Sync {
		name = "always"
	}
	if s.Nodes > 1 {
		name += fmt.Sprintf(" R%d", s.Nodes)
	}
	return name
}

// topology is the topology a run ensures on st: the default, with Nodes
// replicas.
func (s storage) topology() topology.Config {
	c := topology.DefaultConfig()
	c.Replicas = max(s.Nodes, 1)
	return c
}

// env is one fresh embedded nats-server (file storage in its own
// directory, loopback, a free port), or a fresh cluster of them, with
// Tollgate's topology ensured. Every measured run gets its own, so that no
// run inherits the streams, KV history or consumers of another.
type env struct {
	nodes []*server.Server
	dir   string
	url   string // every node's client URL, comma-separated
	st    storage
	// tools holds the tools' sandboxes (sandbox); empty: dir.
	tools string
}

// sandbox is the directory of the sandbox called name (write_file's files).
func (e *env) sandbox(name string) string {
	if e.tools != "" {
		return filepath.Join(e.tools, name)
	}
	return filepath.Join(e.dir, name)
}

// startEnv is startEnv in b's work directory, with the tools' sandboxes in
// a directory of their own below b's ToolDir (Config.ToolDir's doc says
// why) unless ToolDir is "store".
func (b *bencher) startEnv(st storage) (*env, error) {
	e, err := startEnv(b.cfg.WorkDir, st)
	if err != nil || b.cfg.ToolDir == ToolDirStore {
		return e, err
	}
	if e.tools, err = os.MkdirTemp(b.cfg.ToolDir, "tollgate-bench-tools-*"); err != nil {
		e.close()
		return nil, fmt.Errorf("bench: a tools directory in %s: %w", b.cfg.ToolDir, err)
	}
	return e, nil
}

// startEnv starts a server, or st.Nodes servers as a cluster, in a new
// directory below parent, and ensures st's topology.
func startEnv(parent string, st storage) (*env, error) {
	dir, err := os.MkdirTemp(parent, "run-*")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, st: st}
	if err := e.startNodes(); err != nil {
		e.close()
		return nil, err
	}
	nc, js, err := e.connect("tollgate-bench-setup")
	if err != nil {
		e.close()
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if st.Nodes > 1 {
		// JetStream answers once the nodes have elected a meta leader.
		for {
			actx, acancel := context.WithTimeout(ctx, time.Second) // a request before the election may go unanswered
			_, err = js.AccountInfo(actx)
			acancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			e.close()
			return nil, fmt.Errorf("the cluster elects no JetStream meta leader: %w", err)
		}
	}
	if err := topology.Ensure(ctx, js, st.topology()); err != nil {
		e.close()
		return nil, fmt.Errorf("ensure topology: %w", err)
	}
	if st.Nodes > 1 {
		if err := leadersElected(ctx, js); err != nil {
			e.close()
			return nil, err
		}
	}
	return e, nil
}

// leadersElected waits until every stream (KV buckets included) has a
// leader: a run that starts before would meet "no responders" on a stream
// still electing.
func leadersElected(ctx context.Context, js jetstream.JetStream) error {
	names := js.StreamNames(ctx)
	var all []string
	for n := range names.Name() {
		all = append(all, n)
	}
	if err := names.Err(); err != nil {
		return fmt.Errorf("list streams: %w", err)
	}
	for _, n := range all {
		for {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			s, err := js.Stream(actx, n)
			var info *jetstream.StreamInfo
			if err == nil {
				info, err = s.Info(actx)
			}
			cancel()
			if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("stream %s elects no leader: %w", n, ctx.Err())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// startNodes starts e's servers: one, or a cluster of st.Nodes with routes
// on loopback ports chosen up front.
func (e *env) startNodes() error {
	if e.st.Nodes <= 1 {
		ns, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(e.dir, "jetstream"), Port: -1, SyncAlways: e.st.Sync, ServerName: "tollgate-bench"})
		if err != nil {
			return err
		}
		e.nodes, e.url = []*server.Server{ns}, ns.ClientURL()
		return nil
	}
	var routes []string
	ports := make([]int, e.st.Nodes)
	for i := range ports {
		port, err := embedded.FreePort()
		if err != nil {
			return err
		}
		ports[i] = port
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", port))
	}
	var urls []string
	for i, port := range ports {
		name := fmt.Sprintf("bench-n%d", i+1)
		ns, err := embedded.Start(embedded.Options{
			StoreDir: filepath.Join(e.dir, name), Port: -1, SyncAlways: e.st.Sync, ServerName: name,
			Cluster: &embedded.Cluster{Name: "tollgate-bench", Port: port, Routes: routes},
		})
		if err != nil {
			return fmt.Errorf("start node %s: %w", name, err)
		}
		e.nodes = append(e.nodes, ns)
		urls = append(urls, ns.ClientURL())
	}
	e.url = strings.Join(urls, ",")
	return nil
}

// connect opens a client connection with a JetStream handle whose async
// publish window is asyncWindow.
func (e *env) connect(name string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(e.url, append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", e.url, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(asyncWindow))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// storedWrites is the number of messages ever stored in every stream on
// e (the sum of their last sequences): each stream publish and each KV
// write is one.
func (e *env) storedWrites(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	var n uint64
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		n += info.State.LastSeq
	}
	return n, l.Err()
}

// close shuts the server down and removes its directory.
func (e *env) close() {
	for _, ns := range e.nodes {
		ns.Shutdown()
	}
	for _, ns := range e.nodes {
		ns.WaitForShutdown()
	}
	os.RemoveAll(e.dir)
	if e.tools != "" {
		os.RemoveAll(e.tools)
	}
}

// asyncWindow bounds the unacknowledged async publishes of the driver and
// the raw references: nats.go stalls (and then errors) an unbounded
// publisher.
const asyncWindow = 256

// allInOne runs the four stages in this process on one connection, wired
// exactly as `tollgate dev` wires them (tollgate.New, NATS tool service
// discovery on), with the built-in policy. Its registry holds the stages' metrics. A stage can be paused
// (drained and stopped) and resumed, which the trace uses to order the
// stages' work.
type allInOne struct {
	nc   *nats.Conn
	reg  *prometheus.Registry
	logf *os.File
	p    *tollgate.Pipeline

	mu      sync.Mutex
	running map[string]*stageRun
}

type stageRun struct {
	cancel context.CancelFunc
	done   chan error
}

// startAllInOne starts the stages on e; with plan set, the planner stage
// too (as `tollgate dev --llm-url`).
func startAllInOne(e *env, keys *seal.KeyRing, logLevel string, plan *planner.Options) (*allInOne, error) {
	ts, err := stagecmd.Tools(e.sandbox("sandbox"))
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(e.dir, "tollgate.log"))
	if err != nil {
		return nil, err
	}
	log := newLogger(logf, logLevel)
	nc, js, err := scaffold.Connect(e.url, "", "tollgate-bench-allinone", log)
	if err != nil {
		logf.Close()
		return nil, err
	}
	reg := prometheus.NewRegistry()
	// NATS tool services are discovered, as by `tollgate dev` (on by
	// default).
	ps, err := stagecmd.Providers(nc, scaffold.Common{ToolServices: true}, log, reg)
	if err != nil {
		nc.Close()
		logf.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := tollgate.New(ctx, tollgate.Config{
		JS: js, Policy: policy.Default(), Keys: keys, Tools: ts, Providers: ps,
		Logger: log, Registerer: reg, Instance: "bench", Topology: e.st.topology(), Planner: plan,
	})
	if err != nil {
		nc.Close()
		logf.Close()
		return nil, err
	}
	a := &allInOne{nc: nc, reg: reg, logf: logf, p: p, running: map[string]*stageRun{}}
	for _, s := range p.Stages() {
		a.resume(s)
	}
	return a, nil
}

// resume runs stage if it is not running.
func (a *allInOne) resume(stage string) error {
	a.mu.Lock()
	if a.running[stage] != nil {
		a.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &stageRun{cancel: cancel, done: make(chan error, 1)}
	a.running[stage] = r
	go func() { r.done <- a.p.RunStages(ctx, stage) }()
	a.mu.Unlock()
	watching := func() error { return nil }
	switch stage {
	case tollgate.StageApprover:
		watching = a.p.Approver.Watching
	case tollgate.StageRedriver:
		watching = a.p.Redriver.Sweeping
	}
	deadline := time.Now().Add(30 * time.Second)
	for err := watching(); err != nil; err = watching() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", stage, err)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// pause drains stage and waits until it has stopped.
func (a *allInOne) pause(stage string) error {
	a.mu.Lock()
	r := a.running[stage]
	delete(a.running, stage)
	a.mu.Unlock()
	if r == nil {
		return nil
	}
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err // names the stage
		}
		return nil
	case <-time.After(60 * time.Second):
		return fmt.Errorf("stage %s did not stop within 60s", stage)
	}
}

func (a *allInOne) consumer(stage string) string { return stageConsumer[stage].Config.Durable }

// stop drains the stages and closes the connection.
func (a *allInOne) stop() error {
	var errs []error
	for _, s := range a.p.Stages() {
		if err := a.pause(s); err != nil {
			errs = append(errs, err)
		}
	}
	a.nc.Close()
	a.logf.Close()
	return errors.Join(errs...)
}

// counter sums the counter name over the series whose labels include
// labels.
func (a *allInOne) counter(name string, labels map[string]string) float64 {
	mfs, err := a.reg.Gather()
	if err != nil {
		return 0
	}
	return metrics.Sum(mfs, name, labels)
}

// histogram is the sum and count of the histogram name (one series).
func (a *allInOne) histogram(name string) (sum float64, count uint64) {
	mfs, err := a.reg.Gather()
	if err != nil {
		return 0, 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				if h := m.GetHistogram(); h != nil {
					sum, count = sum+h.GetSampleSum(), count+h.GetSampleCount()
				}
			}
		}
	}
	return sum, count
}

// newLogger is the stages' logger: a text handler at level, as the
// binaries log (scaffold.Logger), writing to w.
func newLogger(w *os.File, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}
