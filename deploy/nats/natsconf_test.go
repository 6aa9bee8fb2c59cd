// Package natsconf_test runs Tollgate under deploy/nats/least-privilege.conf:
// the real file, loaded as nats-server loads it, with only the listen
// address and the store directory overridden. The admin user provisions the
// topology; each stage then runs on its own connection as its own user
// (built by tollgate.New, as the stage binaries are), a turn with an
// approval goes through them end to end, and every stage and the cli
// transport are shown to be refused what their grants leave out, without
// anything landing.
package natsconf_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	approverpkg "github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const (
	confFile = "least-privilege.conf"
	// apiPrefix is where every account but TOLLGATE imports TOLLGATE's
	// JetStream API (see the config's header).
	apiPrefix = "JS.TOLLGATE.API"
	// cliConsumer is the transport's durable on the events stream.
	cliConsumer = "transport-cli"
	// wait bounds each poll. Alone, the three-node runs take 3-4 s; under
	// make test's load (-race, two packages at a time on two cores) the
	// cluster's first elections and the stages' first consumes took over
	// 20 s twice, so the bound is generous: these tests check what the
	// config permits, not how fast. Scaled like every test deadline where
	// it goes through jstest (Eventually, After, ctx).
	wait = jstest.LongWait
)

// users and the environment variable holding each one's password.
var users = map[string]string{
	"admin": "TOLLGATE_PW_ADMIN", "ingest": "TOLLGATE_PW_INGEST", "executor": "TOLLGATE_PW_EXECUTOR",
	"approver": "TOLLGATE_PW_APPROVER", "redriver": "TOLLGATE_PW_REDRIVER", "cli": "TOLLGATE_PW_CLI",
	"toolsvc": "TOLLGATE_PW_TOOLSVC", "gateway": "TOLLGATE_PW_GATEWAY",
	"planner": "TOLLGATE_PW_PLANNER", "slack": "TOLLGATE_PW_SLACK", "discord": "TOLLGATE_PW_DISCORD",
}

func password(user string) string { return "test-password-of-" + user }

// accountOf is how each user connects from its account, as the binaries
// do with --inbox-prefix and --js-api-prefix: the stages, the gateway and
// the Slack and Discord transports with inboxes of their own and TOLLGATE's
// API under apiPrefix; the cli
// transport with that API; admin, in TOLLGATE, and toolsvc, which uses no
// JetStream, with the defaults.
func accountOf(user string) scaffold.Account {
	switch user {
	case "admin", "toolsvc":
		return scaffold.Account{}
	case "cli":
		return scaffold.Account{APIPrefix: apiPrefix}
	}
	return scaffold.Account{InboxPrefix: "_INBOX_" + user, APIPrefix: apiPrefix}
}

// apiOf is the subject prefix of the JetStream API as c calls it.
func apiOf(c *client) string {
	if p := accountOf(c.user).APIPrefix; p != "" {
		return p + "."
	}
	return jetstream.DefaultAPIPrefix
}

// startServer loads the config file as nats-server does and runs it
// in-process on a random loopback port with a temporary store.
func startServer(t *testing.T) *server.Server {
	t.Helper()
	for user, env := range users {
		t.Setenv(env, password(user))
	}
	opts, err := server.ProcessConfigFile(confFile)
	if err != nil {
		t.Fatalf("load %s: %v", confFile, err)
	}
	if !opts.JetStream || !opts.SyncAlways {
		t.Fatalf("%s: want JetStream with sync_interval: always, got jetstream %v sync always %v", confFile, opts.JetStream, opts.SyncAlways)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	opts.HTTPHost, opts.HTTPPort = "", 0
	opts.StoreDir = t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	ns, err := embedded.RunWithin(opts, nil, jstest.Ready())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// client is one user's connection. It records the asynchronous errors
// (permissions violations) the server reports on it.
type client struct {
	user string
	nc   *nats.Conn
	js   jetstream.JetStream

	mu   sync.Mutex
	errs []string
}

func dial(t *testing.T, ns *server.Server, user string) *client {
	t.Helper()
	return dialURL(t, ns.ClientURL(), user)
}

// dialURL connects as user to url (a list, for a cluster) the way the
// binaries do (scaffold.Account.Connect), with user's account settings.
func dialURL(t *testing.T, url, user string) *client {
	t.Helper()
	c := &client{user: user}
	nc, js, err := accountOf(user).Connect(url, "", "natsconf-test-"+user, pipelinetest.Logger(),
		nats.UserInfo(user, password(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.errs = append(c.errs, err.Error())
		}))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	c.nc, c.js = nc, js
	return c
}

// reported returns the asynchronous errors the server reported on c so far.
func (c *client) reported() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.errs...)
}

// waitDenied waits until the server has reported a permissions violation
// for publishing on subject. It fails at once if the attempt ends (on done)
// before that: an attempt the server refuses gets no answer.
func (c *client) waitDenied(t *testing.T, subject string, done <-chan error) {
	t.Helper()
	want := fmt.Sprintf("Permissions Violation for Publish to %q", subject)
	jstest.Eventually(t, wait, c.user+": "+want, func() bool {
		select {
		case err := <-done:
			t.Fatalf("%s: the attempt ended (err %v) before the server refused %s; reported: %v", c.user, err, subject, c.reported())
		default:
		}
		for _, e := range c.reported() {
			if strings.Contains(e, nats.ErrPermissionViolation.Error()) && strings.Contains(e, want) {
				return true
			}
		}
		return false
	})
}

// ctx is a context that ends after d, scaled by jstest.Scale, or with the test.
func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), jstest.Scale(d))
	t.Cleanup(cancel)
	return c
}

// eventually polls cond, each try with a fresh bounded context, until it
// holds or wait passes.
func eventually(t *testing.T, what string, cond func(context.Context) bool) {
	t.Helper()
	jstest.Eventually(t, wait, what, func() bool {
		c, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		return cond(c)
	})
}

// caughtUp waits until admin sees the durable consumer on stream caught up
// with every message its filter matches (jstest.CaughtUp: pending counts
// alone can say "idle" right after a publish).
func caughtUp(t *testing.T, admin *client, stream, durable string) {
	t.Helper()
	jstest.EventuallyState(t, wait, durable+" caught up", func() (bool, string) {
		c, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		return jstest.CaughtUp(c, admin.js, stream, durable)
	})
}

// provision is what admin does before any stage starts (deploy/README.md):
// the streams and buckets, and the transport's durable consumer on the
// events stream, from the same JSON file `nats consumer add --config` reads.
func provision(t *testing.T, admin *client) {
	t.Helper()
	provisionAs(t, admin, topology.DefaultConfig())
}

// provisionAs is provision with topo (e.g. three replicas).
func provisionAs(t *testing.T, admin *client, topo topology.Config) {
	t.Helper()
	c := ctx(t, wait)
	if err := topology.Ensure(c, admin.js, topo); err != nil {
		t.Fatalf("admin: ensure topology: %v", err)
	}
	data, err := os.ReadFile(cliConsumer + ".consumer.json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg jetstream.ConsumerConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s.consumer.json: %v", cliConsumer, err)
	}
	if cfg.Durable != cliConsumer || cfg.AckPolicy != jetstream.AckExplicitPolicy || len(cfg.FilterSubjects) == 0 {
		t.Fatalf("%s.consumer.json: %+v", cliConsumer, cfg)
	}
	if _, err := admin.js.CreateOrUpdateConsumer(c, topology.StreamEvents, cfg); err != nil {
		t.Fatalf("admin: create %s: %v", cliConsumer, err)
	}
	// Its consumers of the turn logs' outcome events, as
	// `tollgate provision --outcome-reader transport-cli` makes them.
	if made, err := outcomes.EnsureConsumers(c, admin.js, cliConsumer); err != nil || len(made) != topo.TurnLogPartitionCount() {
		t.Fatalf("admin: create %s's outcome consumers: %v %v", cliConsumer, made, err)
	}
}

// stage is one running stage.
type stage struct {
	*client
	reg *prometheus.Registry
	p   *tollgate.Pipeline // as the stage binary builds it, on the stage's connection
}

// runStages builds each stage with tollgate.New on its own connection as
// its own user, and runs them until stop (or the end of the test).
func runStages(t *testing.T, ns *server.Server, sandbox string) (stages map[string]*stage, stop func()) {
	t.Helper()
	return runStagesOn(t, ns.ClientURL(), topology.DefaultConfig(), sandbox)
}

// runStagesOn is runStages on the server(s) at url, with topo provisioned.
func runStagesOn(t *testing.T, url string, topo topology.Config, sandbox string) (stages map[string]*stage, stop func()) {
	t.Helper()
	return runStageSet(t, url, topo, sandbox, tollgate.AllStages(), nil)
}

// runStageSet is runStagesOn for the stages named, each built with the
// settings configure adds (if not nil) to its tollgate.Config.
func runStageSet(t *testing.T, url string, topo topology.Config, sandbox string, names []string, configure func(name string, cfg *tollgate.Config)) (stages map[string]*stage, stop func()) {
	t.Helper()
	builtins, err := tools.Builtins(sandbox)
	if err != nil {
		t.Fatal(err)
	}
	stages = map[string]*stage{}
	for _, name := range names {
		s := &stage{client: dialURL(t, url, name), reg: prometheus.NewRegistry()}
		cfg := tollgate.Config{
			JS: s.js, Policy: policy.Default(), Keys: pipelinetest.Keys(t), Tools: builtins, Logger: pipelinetest.Logger(),
			Registerer: s.reg, Instance: "natsconf-test", Topology: topo, Stages: []string{name},
		}
		if configure != nil {
			configure(name, &cfg)
		}
		if s.p, err = tollgate.New(ctx(t, wait), cfg); err != nil {
			t.Fatalf("build %s as user %s: %v (server said: %v)", name, name, err, s.reported())
		}
		stages[name] = s
	}
	c, cancel := context.WithCancel(context.Background())
	done := make(chan error, len(stages))
	for _, s := range stages {
		go func() { done <- s.p.Run(c) }()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			deadline := jstest.After(wait)
			for range stages {
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("stages: %v", err)
					}
				case <-deadline:
					t.Errorf("stages did not stop within %v", jstest.Scale(wait))
					return
				}
			}
		})
	}
	t.Cleanup(stop)
	return stages, stop
}

// gauge reads a gauge from reg (0 if absent).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// publish is a JetStream publish of a Tollgate record by c.
func publish(t *testing.T, c *client, subject, msgID string, r schemas.Record) {
	t.Helper()
	data, err := schemas.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.js.Publish(ctx(t, wait), subject, data, jetstream.WithMsgID(msgID)); err != nil {
		t.Fatalf("%s: publish %s: %v", c.user, subject, err)
	}
}

// send publishes a message from alice on the cli transport, as
// `tollgate send` does, and returns its turn id.
func send(t *testing.T, cli *client, messageID, session string, calls ...schemas.ProposedCall) string {
	t.Helper()
	msg := &schemas.InboundMessage{
		Transport: "cli", MessageID: messageID, SessionID: session,
		Sender:  schemas.Sender{ID: "alice", Display: "Alice", Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM},
		Text:    "please", Calls: calls, SentAt: time.Now().UTC(),
	}
	publish(t, cli, topology.InboundSubject("cli", session), "cli:"+messageID, msg)
	return schemas.TurnID(msg.Transport, msg.MessageID)
}

// stored returns how many messages stream holds on subject.
func stored(t *testing.T, admin *client, stream, subject string) uint64 {
	t.Helper()
	s, err := admin.js.Stream(ctx(t, wait), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx(t, wait), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// loggedEvent waits for turn's last event named event in its turn log
// (docs/protocol.md 4.2a) and returns its record.
func loggedEvent(t *testing.T, admin *client, turn, event string) []byte {
	t.Helper()
	p := topology.TurnLogPartition(turn, topology.DefaultTurnLogPartitions)
	s, err := admin.js.Stream(ctx(t, wait), topology.TurnLogStream(p))
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	eventually(t, "the "+event+" event of "+turn, func(c context.Context) bool {
		m, err := s.GetLastMsgForSubject(c, topology.TurnLogSubject(p, turn, event))
		if err == nil {
			data = m.Data
		}
		return err == nil
	})
	return data
}

// loggedOutcome waits for turn's outcome event (the write that ended its
// batch) and returns the outcome its record keeps.
func loggedOutcome(t *testing.T, admin *client, turn string) *schemas.TurnOutcome {
	t.Helper()
	o, err := store.DecodeOutcome(turn, loggedEvent(t, admin, turn, store.EventOutcome))
	if err != nil {
		t.Fatalf("the outcome event of %s: %v", turn, err)
	}
	return o
}

// loggedRequest waits for turn's awaiting event (the move to awaiting,
// which keeps the approvals it requested) and returns its first request.
func loggedRequest(t *testing.T, admin *client, turn string) *schemas.ApprovalRecord {
	t.Helper()
	reqs, err := store.DecodeRequested(turn, loggedEvent(t, admin, turn, store.EventAwaiting))
	if err != nil || len(reqs) == 0 {
		t.Fatalf("the awaiting event of %s: %+v, %v; want its request", turn, reqs, err)
	}
	return reqs[0]
}

// nextOutcome pulls from cons, a reader's consumer of the outcome events
// of turn's turn-log partition (acking all it reads), until turn's
// arrives, and returns the outcome its record keeps.
func nextOutcome(t *testing.T, cons jetstream.Consumer, turn string) *schemas.TurnOutcome {
	t.Helper()
	p := topology.TurnLogPartition(turn, topology.DefaultTurnLogPartitions)
	o, err := store.DecodeOutcome(turn, nextEvent(t, cons, topology.TurnLogSubject(p, turn, store.EventOutcome)))
	if err != nil {
		t.Fatalf("the outcome event of %s: %v", turn, err)
	}
	return o
}

// nextRequests pulls from cons, a reader's consumer of the awaiting and
// outcome events of turn's turn-log partition (acking all it reads),
// until turn's awaiting event arrives, and returns the requests its
// record keeps.
func nextRequests(t *testing.T, cons jetstream.Consumer, turn string) []*schemas.ApprovalRecord {
	t.Helper()
	p := topology.TurnLogPartition(turn, topology.DefaultTurnLogPartitions)
	reqs, err := store.DecodeRequested(turn, nextEvent(t, cons, topology.TurnLogSubject(p, turn, store.EventAwaiting)))
	if err != nil {
		t.Fatalf("the awaiting event of %s: %v", turn, err)
	}
	return reqs
}

// nextEvent fetches from the transport's durable consumer (acking all it
// reads up to it) until an event on subject arrives, and returns its
// data; the events fetched with it, after it, are left for the next call.
// nextDecision fetches from cons, a consumer of the approvals bucket's
// stream, until it delivers the decision of approval id (store.DecidedOf),
// acknowledging what it passes.
func nextDecision(t *testing.T, cons jetstream.Consumer, id string) *schemas.DecidedEvent {
	t.Helper()
	var got *schemas.DecidedEvent
	jstest.Eventually(t, wait, "the decision of "+id, func() bool {
		batch, err := cons.Fetch(16, jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil {
			t.Fatalf("fetch decisions: %v", err)
		}
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				t.Fatalf("ack: %v", err)
			}
			if ev, err := store.DecidedOf(m.Subject(), m.Headers(), m.Data()); err == nil && ev != nil && ev.ApprovalID == id {
				got = ev
			}
		}
		return got != nil
	})
	return got
}

func nextEvent(t *testing.T, cons jetstream.Consumer, subject string) []byte {
	t.Helper()
	var found []byte
	var seen []string
	jstest.EventuallyState(t, wait, "an event on "+subject, func() (bool, string) {
		batch, err := cons.Fetch(16, jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil {
			t.Fatalf("cli: fetch events: %v", err)
		}
		for m := range batch.Messages() {
			if found != nil {
				// Left for the next call (the reader's next event): not
				// acked, so it comes again at once.
				if err := m.Nak(); err != nil {
					t.Fatalf("cli: nak: %v", err)
				}
				continue
			}
			if err := m.Ack(); err != nil {
				t.Fatalf("cli: ack: %v", err)
			}
			if m.Subject() == subject {
				found = m.Data()
			}
			seen = append(seen, m.Subject())
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("cli: fetch events: %v", err)
		}
		return found != nil, fmt.Sprintf("events on %v", seen)
	})
	return found
}

func TestLeastPrivilegeConfig(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	sandbox := filepath.Join(t.TempDir(), "sandbox")
	stages, stopStages := runStages(t, ns, sandbox)
	cli := dial(t, ns, "cli")
	adminKV, err := topology.OpenBuckets(ctx(t, wait), admin.js)
	if err != nil {
		t.Fatal(err)
	}
	adminStore := store.New(adminKV)
	waitBatch := func(turn string, st schemas.BatchState) {
		t.Helper()
		eventually(t, "batch "+turn+" "+string(st), func(c context.Context) bool {
			b, _, err := adminStore.Batches.Get(c, turn)
			return err == nil && b.State == st
		})
	}
	echo := schemas.ProposedCall{Tool: "echo", Args: `{"text":"hi"}`}

	// ---- a turn with an approval, end to end -----------------------
	events, err := cli.js.Consumer(ctx(t, wait), topology.StreamEvents, cliConsumer)
	if err != nil {
		t.Fatalf("cli: bind %s: %v", cliConsumer, err)
	}
	turn := schemas.TurnID("cli", "m-approved")
	if got := send(t, cli, "m-approved", "least-privilege", echo,
		schemas.ProposedCall{Tool: "write_file", Args: `{"path":"approved.txt","content":"approved by alice"}`}); got != turn {
		t.Fatalf("turn id %s, want %s", got, turn)
	}

	// The request, from the transport's consumer of its turn log's
	// partition: the batch's move to awaiting keeps it (docs/protocol.md
	// 4.2a); the outcome comes on the same consumer, after it.
	outcomeCons, err := cli.js.Consumer(ctx(t, wait), topology.TurnLogStream(topology.TurnLogPartition(turn, topology.DefaultTurnLogPartitions)),
		outcomes.Durable(cliConsumer, topology.TurnLogPartition(turn, topology.DefaultTurnLogPartitions)))
	if err != nil {
		t.Fatalf("cli: bind its outcome consumer: %v", err)
	}
	reqs := nextRequests(t, outcomeCons, turn)
	if len(reqs) != 1 {
		t.Fatalf("requests from the log: %+v, want one", reqs)
	}
	req := reqs[0]
	if req.Tool != "write_file" || req.Status != schemas.ApprovalPending || req.Context.Requester.Principal != "cli:alice" {
		t.Fatalf("approval requested: %+v", req)
	}
	jstest.Eventually(t, wait, "the approver's KV watch counts the pending approval", func() bool {
		return gauge(t, stages["approver"].reg, "tollgate_approvals_pending") == 1
	})
	// The executor's view of the session records: its KV watch is allowed
	// (pipeline/batch/records.go), so a session's first entry reads no
	// record.
	jstest.Eventually(t, wait, "the executor's view of the session records is current", func() bool {
		return gauge(t, stages["executor"].reg, "tollgate_session_records_view_current") == 1
	})

	// As `tollgate approve` does: subscribe to the answers (the
	// approval's revisions, its rejections), then decide.
	rejections, err := cli.nc.SubscribeSync(topology.EventSubject(topology.SubjectDecisionRejected, req.ApprovalID))
	if err != nil {
		t.Fatal(err)
	}
	revisions, err := cli.nc.SubscribeSync(topology.ApprovalRevisionSubject(req.ApprovalID))
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Each decision is a request to the approver's service, through the
	// service import from APPROVER: answered, not stored on the stream
	// (which a denied request would have been, after its timeout).
	decide := func(id, option string, want submit.Result) {
		t.Helper()
		d := &schemas.Decision{
			DecisionID: id, ApprovalID: req.ApprovalID, Transport: "cli",
			Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true},
			Option:  option, ArgsDigest: req.ArgsDigest, SentAt: time.Now().UTC(),
		}
		// The approver serves decisions before it consumes (its Run), and
		// its consumer's check is answered on the same connection after
		// the service's subscription: until then a decision would be
		// stored on the stream instead (Queued).
		jstest.Eventually(t, wait, "the approver consumes, its decision service up", func() bool {
			for _, c := range stages["approver"].p.Checks() {
				if c.Name == approverpkg.Stage+"/consumer" {
					return c.Check(context.Background()) == nil
				}
			}
			return false
		})
		a, err := submit.Decision(ctx(t, wait), cli.js, d)
		if err != nil || a.Result != want {
			t.Fatalf("cli: decision %s answered %+v, %v; want %s", id, a, err, want)
		}
	}
	decide("d-approve", schemas.OptionApprove, submit.Applied)
	// The decision is the record's revision: heard (a wake-up), then
	// read as stored.
	if _, err := revisions.NextMsg(wait); err != nil {
		t.Fatalf("cli: no revision of the approval heard: %v", err)
	}
	cliKV, err := cli.js.KeyValue(ctx(t, wait), topology.BucketApprovals)
	if err != nil {
		t.Fatalf("cli: the approvals bucket: %v", err)
	}
	eventually(t, "the cli reads the approval decided", func(c context.Context) bool {
		e, err := cliKV.Get(c, req.ApprovalID)
		if err != nil {
			return false
		}
		a, err := schemas.Decode[schemas.ApprovalRecord](e.Value())
		return err == nil && a.Status == schemas.ApprovalApproved && a.Decision != nil && a.Decision.DecisionID == "d-approve"
	})
	// A conflicting second decision is rejected, and the rejection reaches
	// the transport.
	decide("d-deny-too-late", schemas.OptionDeny, submit.Rejected)
	m, err := rejections.NextMsg(wait)
	if err != nil {
		t.Fatalf("cli: no rejection: %v", err)
	}
	if rej, err := schemas.Decode[schemas.DecisionRejected](m.Data); err != nil || rej.Code != schemas.CodeApprovalAlreadyDecided || rej.DecisionID != "d-deny-too-late" {
		t.Fatalf("rejection: %+v, %v", rej, err)
	}

	// The outcome, from the same consumer (it is not published: the log
	// keeps it).
	out := nextOutcome(t, outcomeCons, turn)
	if out.State != schemas.TurnCompleted || len(out.Results) != 2 ||
		out.Results[0].Status != schemas.ResultOK || out.Results[1].Status != schemas.ResultOK || out.Results[1].ApprovalID != req.ApprovalID {
		t.Fatalf("outcome: %+v", out)
	}
	for _, c := range []jetstream.Consumer{events, outcomeCons} {
		eventually(t, "the transport's acks reach its consumer", func(ctx context.Context) bool {
			info, err := c.Info(ctx)
			return err == nil && info.NumAckPending == 0 && info.AckFloor.Consumer == info.Delivered.Consumer
		})
	}
	if b, err := os.ReadFile(filepath.Join(sandbox, "approved.txt")); err != nil || string(b) != "approved by alice" {
		t.Fatalf("the approved write_file did not run: %q, %v", b, err)
	}
	jstest.Eventually(t, wait, "the approver's KV watch sees the approval decided", func() bool {
		return gauge(t, stages["approver"].reg, "tollgate_approvals_pending") == 0
	})

	// ---- failure paths: abandon, session hand-over, repeated finish -
	// A batch that fails with a pending approval abandons it (KV write
	// and decided event) and hands its session to the next queued turn
	// (ready notice). Both the executor and the redriver do this, on
	// their own connections; the redriver, woken by the abandoned event,
	// then finds the outcome already published (stream message get).
	for _, p := range []struct {
		stage, session string
	}{{"executor", "abandoned-by-executor"}, {"redriver", "abandoned-by-redriver"}} {
		eng := stages[p.stage].p.Engine
		waiting := send(t, cli, "m-"+p.session, p.session, schemas.ProposedCall{Tool: "write_file", Args: `{"path":"never.txt","content":"x"}`})
		waitBatch(waiting, schemas.BatchAwaiting)
		queued := send(t, cli, "m-"+p.session+"-next", p.session, echo)
		waitBatch(queued, schemas.BatchQueued)

		if err := eng.Abort(ctx(t, wait), waiting, schemas.CodeRetriesExhausted, "given up in a test"); err != nil {
			t.Fatalf("%s: abort %s: %v", p.stage, waiting, err)
		}
		id := schemas.ApprovalID(waiting, 0)
		if a, _, err := adminStore.Approvals.Get(ctx(t, wait), id); err != nil || a.Status != schemas.ApprovalAbandoned {
			t.Fatalf("%s: approval %s after abort: %+v, %v", p.stage, id, a, err)
		}
		// Its abandoned record's revision is its decided event.
		kvs, err := admin.js.Stream(ctx(t, wait), topology.StreamApprovals)
		if err != nil {
			t.Fatal(err)
		}
		last, err := kvs.GetLastMsgForSubject(ctx(t, wait), topology.ApprovalRevisionSubject(id))
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := store.DecidedOf(last.Subject, last.Header, last.Data); err != nil || ev == nil || ev.Status != schemas.ApprovalAbandoned {
			t.Fatalf("%s: the decision of %s: %+v, %v", p.stage, id, ev, err)
		}
		if o := loggedOutcome(t, admin, waiting); o.State != schemas.TurnFailed {
			t.Fatalf("%s: outcome of %s: %+v", p.stage, waiting, o)
		}
		if o := loggedOutcome(t, admin, queued); o.State != schemas.TurnCompleted {
			t.Fatalf("%s: outcome of the queued turn %s: %+v", p.stage, queued, o)
		}
		b, _, err := adminStore.Batches.Get(ctx(t, wait), waiting)
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.Finish(ctx(t, wait), b); err != nil {
			t.Fatalf("%s: finish %s again: %v", p.stage, waiting, err)
		}
		part := topology.TurnLogPartition(waiting, topology.DefaultTurnLogPartitions)
		if n := stored(t, admin, topology.TurnLogStream(part), topology.TurnLogSubject(part, waiting, store.EventOutcome)); n != 1 {
			t.Fatalf("%s: %d outcome events of %s, want 1", p.stage, n, waiting)
		}
		if n := stored(t, admin, topology.StreamEvents, topology.EventSubject(topology.SubjectTurnOutcome, waiting)); n != 0 {
			t.Fatalf("%s: %d published outcomes of %s, want none (its log keeps it)", p.stage, n, waiting)
		}
	}

	// Dead letters: each stage may write its own.
	if _, err := cli.js.Publish(ctx(t, wait), topology.InboundSubject("cli", "s1"), []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.js.Publish(ctx(t, wait), topology.DecisionSubject("cli", "a-nothing-0"), []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	dlq, err := admin.js.Stream(ctx(t, wait), topology.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"ingest", "approver"} {
		eventually(t, s+" dead-letters the malformed message", func(c context.Context) bool {
			_, err := dlq.GetLastMsgForSubject(c, topology.DLQSubject(s))
			return err == nil
		})
	}

	// Let every stage finish what it has, then: the grants were enough,
	// no stage was refused anything on the way.
	for _, d := range topology.Consumers() {
		caughtUp(t, admin, d.Stream, d.Config.Durable)
	}
	for name, s := range stages {
		if errs := s.reported(); len(errs) > 0 {
			t.Errorf("stage %s was refused: %v", name, errs)
		}
	}
	if errs := cli.reported(); len(errs) > 0 {
		t.Errorf("transport cli was refused: %v", errs)
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("refused", func(t *testing.T) {
		testRefusals(t, admin, adminKV, stages, cli, turn, req.ApprovalID)
	})
	// What the refusals caused; anything after is a grant missing.
	seen := map[*client]int{}
	for _, s := range stages {
		seen[s.client] = len(s.reported())
	}

	// Reply subjects are not covered by publish permissions, and
	// JetStream answers in the account of the request: were a stage or
	// the transport in TOLLGATE, the stream's acknowledgement of these
	// publishes would be written to the KV key and the decision subject.
	// Their accounts' imports bring it back into their own accounts.
	for _, c := range []*client{stages["ingest"].client, stages["executor"].client, stages["approver"].client, stages["redriver"].client, cli} {
		subject := topology.DLQSubject(c.user) // every stage may write its own dead letters
		if c == cli {
			subject = topology.InboundSubject("cli", "s1")
		}
		t.Run(c.user+" cannot aim a publish acknowledgement at a KV key or a stream subject", func(t *testing.T) {
			noReplyInjection(t, admin, adminKV, c, subject)
		})
	}

	t.Run("a KV watch grant cannot aim a consumer's deliveries at a KV key", func(t *testing.T) {
		noDeliveryInjection(t, admin, stages["approver"].client, adminKV)
	})

	t.Run("the stages stop cleanly within their grants", func(t *testing.T) {
		// The approver removes its KV watcher when it stops.
		stopStages()
		kvApprovals, err := admin.js.Stream(ctx(t, wait), "KV_"+topology.BucketApprovals)
		if err != nil {
			t.Fatal(err)
		}
		// The redriver's durable stays: it is the one consumer left.
		eventually(t, "the approver's KV watcher is gone", func(c context.Context) bool {
			lister := kvApprovals.ListConsumers(c)
			var names []string
			for ci := range lister.Info() {
				names = append(names, ci.Name)
			}
			return lister.Err() == nil && len(names) == 1 && names[0] == topology.ConsumerRedriver
		})
		for name, s := range stages {
			if errs := s.reported()[seen[s.client]:]; len(errs) > 0 {
				t.Errorf("stage %s was refused: %v", name, errs)
			}
		}
	})
}

// noReplyInjection shows that c, publishing on subject (which it may, and
// which a stream of TOLLGATE stores), cannot have the acknowledgement
// stored elsewhere by naming another subject as the reply: a batches KV
// key, that key as its own account's KV write import names it and a
// turn-log subject (both when c's account writes no batch: not the
// executor's, the redriver's or the planner's), and the decision subject
// of a transport nobody here is. The stream answers publishes in order,
// so once a later publish on subject is acknowledged, the earlier
// acknowledgements have been sent; only then is their absence asserted.
func noReplyInjection(t *testing.T, admin *client, adminKV topology.Buckets, c *client, subject string) {
	t.Helper()
	victim := "t-ack-target-" + c.user
	decision := topology.DecisionSubject("webhook", victim)
	targets := []string{"$KV." + topology.BucketBatches + "." + victim, decision}
	writer := slices.Contains([]string{"executor", "redriver", "planner"}, c.user)
	if !writer && accountOf(c.user).APIPrefix != "" {
		targets = append(targets, accountOf(c.user).APIPrefix+".$KV."+topology.BucketBatches+"."+victim)
	}
	victimLog := topology.TurnLogPartition(victim, len(adminKV.TurnLogs))
	if !writer {
		targets = append(targets, topology.TurnLogSubject(victimLog, victim, string(schemas.BatchCompleted)))
	}
	before := len(c.reported())
	for _, reply := range targets {
		if err := c.nc.PublishRequest(subject, reply, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.js.Publish(ctx(t, wait), subject, []byte("y")); err != nil {
		t.Fatalf("%s: publish %s: %v", c.user, subject, err)
	}
	if e, err := adminKV.Batches.Get(ctx(t, wait), victim); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("batch %s: want not found, got %v, %v", victim, e, err)
	}
	if m, err := adminKV.TurnLogs[victimLog].GetLastMsgForSubject(ctx(t, wait), topology.TurnLogWildcard(victimLog, victim)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("%s holds an event of %s (%v, %v)", topology.TurnLogStream(victimLog), victim, m, err)
	}
	decisions, err := admin.js.Stream(ctx(t, wait), topology.StreamDecisions)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := decisions.GetLastMsgForSubject(ctx(t, wait), decision); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("%s holds a message on %s (%v, %v)", topology.StreamDecisions, decision, m, err)
	}
	if errs := c.reported()[before:]; len(errs) > 0 {
		t.Errorf("%s was refused its own publishes: %v", c.user, errs)
	}
}

// noDeliveryInjection shows that c, whose KV watch grant lets it create
// push consumers on the approvals bucket with any deliver subject (the
// subject is in the request body, out of reach of permissions), cannot
// have the bucket's records delivered onto a batches key: the server
// delivers a push consumer's messages only to a subscriber, and a stream
// is none. The later fact is a second consumer, created after the first
// on the same stream with c's own inbox as deliver subject, having
// delivered; the first has then delivered nothing and nothing is stored.
func noDeliveryInjection(t *testing.T, admin, c *client, adminKV topology.Buckets) {
	t.Helper()
	victim := "t-delivered-" + c.user
	create := func(name, deliver string) {
		t.Helper()
		body, err := json.Marshal(map[string]any{"stream_name": "KV_" + topology.BucketApprovals, "config": map[string]any{
			"name": name, "deliver_subject": deliver, "filter_subject": "$KV." + topology.BucketApprovals + ".>",
			"ack_policy": "none", "deliver_policy": "all", "inactive_threshold": int64(time.Minute)}})
		if err != nil {
			t.Fatal(err)
		}
		subject := apiOf(c) + "CONSUMER.CREATE.KV_" + topology.BucketApprovals + "." + name + ".$KV." + topology.BucketApprovals + ".>"
		m, err := c.nc.RequestWithContext(ctx(t, wait), subject, body)
		if err != nil {
			t.Fatalf("%s: create consumer %s: %v", c.user, name, err)
		}
		var resp struct {
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Error != nil {
			t.Fatalf("%s: create consumer %s: %s", c.user, name, m.Data)
		}
		t.Cleanup(func() {
			if err := c.js.DeleteConsumer(context.Background(), "KV_"+topology.BucketApprovals, name); err != nil {
				t.Errorf("%s: delete consumer %s: %v", c.user, name, err)
			}
		})
	}
	create("aimed-at-a-batch", "$KV."+topology.BucketBatches+"."+victim)
	inbox := c.nc.NewInbox()
	witness, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer witness.Unsubscribe()
	create("witness", inbox)
	if _, err := witness.NextMsg(wait); err != nil {
		t.Fatalf("%s: the witness consumer delivered nothing: %v", c.user, err)
	}
	// jetstream.Consumer binds pull consumers only: ask the API.
	m, err := admin.nc.RequestWithContext(ctx(t, wait), "$JS.API.CONSUMER.INFO.KV_"+topology.BucketApprovals+".aimed-at-a-batch", nil)
	if err != nil {
		t.Fatal(err)
	}
	var info jetstream.ConsumerInfo
	if err := json.Unmarshal(m.Data, &info); err != nil || info.Delivered.Consumer != 0 || info.NumPending == 0 {
		t.Errorf("consumer aimed at a batch key: %s, %v; want messages pending and none delivered", m.Data, err)
	}
	if e, err := adminKV.Batches.Get(ctx(t, wait), victim); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("batch %s: want not found, got %v, %v", victim, e, err)
	}
}

// refusal is one attempt outside a user's grant.
type refusal struct {
	name    string
	by      *client
	subject string                          // the publish the server must refuse
	try     func(ctx context.Context) error // the attempt, with the user's own handles
	check   func(t *testing.T)              // nothing landed or changed
}

func testRefusals(t *testing.T, admin *client, adminKV topology.Buckets, stages map[string]*stage, cli *client, turn, approvalID string) {
	ingest, executor, approver, redriver := stages["ingest"].client, stages["executor"].client, stages["approver"].client, stages["redriver"].client

	noPublish := refusals{admin}.noPublish
	// noRequest: a decision request the server refuses to carry, so that
	// no approver hears it; the approval stays as it was.
	noRequest := func(name string, c *client, subject string) refusal {
		before, _ := adminKV.Approvals.Get(ctx(t, wait), approvalID)
		return refusal{name, c, subject, func(ctx context.Context) error {
			_, err := c.nc.RequestWithContext(ctx, subject, []byte("forged"))
			return err
		}, func(t *testing.T) {
			t.Helper()
			after, err := adminKV.Approvals.Get(ctx(t, wait), approvalID)
			if before != nil && (err != nil || after.Revision() != before.Revision()) {
				t.Fatalf("approval %s changed: revision %v (%v), was %d", approvalID, after, err, before.Revision())
			}
		}}
	}
	// unchanged: no message was added on subject (which has some).
	unchanged := func(stream, subject string) func(*testing.T) {
		before := stored(t, admin, stream, subject)
		return func(t *testing.T) {
			t.Helper()
			if after := stored(t, admin, stream, subject); after != before {
				t.Fatalf("%s: %d messages on %s, was %d", stream, after, subject, before)
			}
		}
	}
	const forged = "t-forged"
	forgedAccepted := topology.AcceptedSubject("s-forged")
	forgedDecision := topology.DecisionSubject("cli", "a-forged-0")
	forgedOutcome := topology.EventSubject(topology.SubjectTurnOutcome, forged)
	forgedRejection := topology.EventSubject(topology.SubjectDecisionRejected, "a-forged-0")
	forgedRequest := topology.EventSubject(topology.SubjectApprovalRequested, forged)
	forgedReady := topology.ReadySubject("s-forged")

	cases := []refusal{
		noPut("ingest cannot write an approval", ingest, adminKV.Approvals, forged),
		noGet("ingest cannot read an approval", ingest, topology.BucketApprovals, approvalID),
		noPublish("ingest cannot submit a decision", ingest, topology.StreamDecisions, forgedDecision),
		noPublish("ingest cannot publish an event", ingest, topology.StreamEvents, forgedOutcome),
		noPublish("ingest cannot announce a ready turn", ingest, topology.StreamTurns, forgedReady),
		{"ingest cannot pull from the executor's consumer", ingest, apiOf(ingest) + "CONSUMER.MSG.NEXT.TOLLGATE_TURNS.executor",
			request(ingest, apiOf(ingest)+"CONSUMER.MSG.NEXT.TOLLGATE_TURNS.executor"), nothing},

		noPublish("executor cannot publish an accepted turn", executor, topology.StreamTurns, forgedAccepted),
		// The executor appends exec entries (a due follow-up, an earlier
		// version's accepted turn), never a planner turn.
		noPublish("executor cannot append a planner turn to a session's order", executor, topology.StreamTurns, topology.OrderSubject(topology.OrderPlan, "s-forged")),
		noPublish("executor cannot submit a decision", executor, topology.StreamDecisions, forgedDecision),
		noPublish("executor cannot publish a decision rejection", executor, topology.StreamEvents, forgedRejection),

		noPut("approver cannot write a batch", approver, adminKV.Batches, forged),
		noPut("approver cannot write a claim", approver, adminKV.Claims, forged+"-0"),
		noPut("approver cannot write a session", approver, adminKV.Sessions, "s-forged"),
		noGet("approver cannot read a batch", approver, topology.BucketBatches, turn),
		noPublish("approver cannot publish an accepted turn", approver, topology.StreamTurns, forgedAccepted),
		noPublish("approver cannot publish a turn outcome", approver, topology.StreamEvents, forgedOutcome),

		{"redriver cannot publish an inbound message", redriver, topology.InboundSubject("cli", "s1"),
			pub(redriver, topology.InboundSubject("cli", "s1")), unchanged(topology.StreamInbound, topology.InboundSubject("cli", "s1"))},
		noPublish("redriver cannot submit a decision", redriver, topology.StreamDecisions, forgedDecision),
		noPublish("redriver cannot publish an accepted turn", redriver, topology.StreamTurns, forgedAccepted),
		noPublish("redriver cannot request an approval", redriver, topology.StreamEvents, forgedRequest),

		noPublish("cli cannot publish on the webhook transport's inbound subject", cli, topology.StreamInbound, topology.InboundSubject("webhook", "s1")),
		noPublish("cli cannot submit a decision as the webhook transport", cli, topology.StreamDecisions, topology.DecisionSubject("webhook", "x")),
		noRequest("cli cannot send a decision request as the webhook transport", cli, topology.DecideSubject("webhook", approvalID)),
		noRequest("ingest cannot send a decision request", ingest, topology.DecideSubject("cli", approvalID)),
		noRequest("the redriver cannot send a decision request", redriver, topology.DecideSubject("cli", approvalID)),
		noPublish("cli cannot publish an event", cli, topology.StreamEvents, forgedOutcome),
		noPublish("cli cannot publish an accepted turn", cli, topology.StreamTurns, forgedAccepted),
		noPut("cli cannot write an approval", cli, adminKV.Approvals, forged),
		{"cli cannot create a consumer", cli, apiOf(cli) + "CONSUMER.CREATE.TOLLGATE_EVENTS.mine",
			func(ctx context.Context) error {
				_, err := cli.js.CreateConsumer(ctx, topology.StreamEvents, jetstream.ConsumerConfig{Durable: "mine"})
				return err
			}, func(t *testing.T) {
				if _, err := admin.js.Consumer(ctx(t, wait), topology.StreamEvents, "mine"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
					t.Fatalf("consumer mine: want not found, got %v", err)
				}
			}},
	}
	for _, b := range []struct {
		kv  jetstream.KeyValue
		key string
	}{{adminKV.Approvals, approvalID}, {adminKV.Batches, turn}, {adminKV.Sessions, "s-forged"}, {adminKV.Claims, forged + "-0"}} {
		bucket, key := b.kv.Bucket(), b.key
		before := kvRevision(t, b.kv, key)
		cases = append(cases, refusal{"cli cannot write the " + bucket + " bucket", cli, kvPut(cli, bucket, key),
			pub(cli, kvPut(cli, bucket, key)), func(t *testing.T) {
				if after := kvRevision(t, b.kv, key); after != before {
					t.Fatalf("%s/%s changed: revision %d -> %d", bucket, key, before, after)
				}
			}})
	}

	// Nobody but admin may delete or reconfigure a stream, purge a
	// bucket or delete a consumer.
	eventsBefore := streamInfo(t, admin, topology.StreamEvents)
	approvalsBefore := streamInfo(t, admin, "KV_"+topology.BucketApprovals)
	for _, c := range []*client{ingest, executor, approver, redriver, cli} {
		cases = append(cases,
			refusal{c.user + " cannot delete a stream", c, apiOf(c) + "STREAM.DELETE." + topology.StreamEvents,
				func(ctx context.Context) error { return c.js.DeleteStream(ctx, topology.StreamEvents) },
				func(t *testing.T) {
					if got := streamInfo(t, admin, topology.StreamEvents); got.Created != eventsBefore.Created {
						t.Fatalf("%s was re-created", topology.StreamEvents)
					}
				}},
			refusal{c.user + " cannot purge the approvals bucket", c, apiOf(c) + "STREAM.PURGE.KV_" + topology.BucketApprovals,
				request(c, apiOf(c)+"STREAM.PURGE.KV_"+topology.BucketApprovals),
				func(t *testing.T) {
					if got := streamInfo(t, admin, "KV_"+topology.BucketApprovals); got.State.Msgs != approvalsBefore.State.Msgs || got.State.FirstSeq != approvalsBefore.State.FirstSeq {
						t.Fatalf("approvals bucket changed: %+v -> %+v", approvalsBefore.State, got.State)
					}
				}},
			refusal{c.user + " cannot change a stream's configuration", c, apiOf(c) + "STREAM.UPDATE." + topology.StreamEvents,
				func(ctx context.Context) error {
					cfg := eventsBefore.Config
					cfg.MaxAge = time.Hour
					_, err := c.js.UpdateStream(ctx, cfg)
					return err
				},
				func(t *testing.T) {
					if got := streamInfo(t, admin, topology.StreamEvents); got.Config.MaxAge != eventsBefore.Config.MaxAge {
						t.Fatalf("%s max age %v -> %v", topology.StreamEvents, eventsBefore.Config.MaxAge, got.Config.MaxAge)
					}
				}},
			refusal{c.user + " cannot delete the redriver's consumer", c, apiOf(c) + "CONSUMER.DELETE." + topology.StreamEvents + "." + topology.ConsumerRedriver,
				func(ctx context.Context) error {
					return c.js.DeleteConsumer(ctx, topology.StreamEvents, topology.ConsumerRedriver)
				},
				func(t *testing.T) {
					if _, err := admin.js.Consumer(ctx(t, wait), topology.StreamEvents, topology.ConsumerRedriver); err != nil {
						t.Fatalf("consumer %s: %v", topology.ConsumerRedriver, err)
					}
				}},
		)
	}
	// A stage started against a drifted topology (here: another max age)
	// does not rewrite the streams: it fails at start and they keep
	// their configuration. Admin provisions; stages only read.
	for _, name := range tollgate.AllStages() {
		c := stages[name].client
		cases = append(cases, refusal{"the " + name + " stage started on a drifted topology cannot reconfigure it", c,
			apiOf(c) + "STREAM.UPDATE." + topology.StreamInbound,
			func(ctx context.Context) error {
				topo := topology.DefaultConfig()
				topo.MaxAge = time.Hour
				_, err := tollgate.New(ctx, tollgate.Config{
					JS: c.js, Policy: policy.Default(), Keys: pipelinetest.Keys(t), Logger: pipelinetest.Logger(),
					Instance: "drifted", Topology: topo, Stages: []string{name},
				})
				return err
			},
			func(t *testing.T) {
				if got := streamInfo(t, admin, topology.StreamInbound); got.Config.MaxAge != topology.DefaultConfig().MaxAge {
					t.Fatalf("%s max age is now %v", topology.StreamInbound, got.Config.MaxAge)
				}
			}})
	}

	runRefusals(t, cases)
}

// runRefusals runs each attempt as a subtest: the server refuses it, it
// gets no answer, and its check holds.
func runRefusals(t *testing.T, cases []refusal) {
	t.Helper()
	for _, rc := range cases {
		t.Run(rc.name, func(t *testing.T) {
			// The server drops a refused publish and reports the refusal
			// on the connection; a refused request therefore never gets an
			// answer. Wait for the report, then stop waiting for the answer.
			actx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- rc.try(actx) }()
			rc.by.waitDenied(t, rc.subject, done)
			cancel()
			err := <-done
			if err == nil {
				t.Fatalf("%s: the attempt succeeded", rc.by.user)
			}
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
				t.Fatalf("%s: want no answer after the refusal, got %v", rc.by.user, err)
			}
			rc.check(t)
		})
	}
}

// refusals builds refusal rows whose checks read with admin's handles.
type refusals struct{ admin *client }

// nothingOn: no message was stored on subject (in any stream).
func (r refusals) nothingOn(stream, subject string) func(*testing.T) {
	return func(t *testing.T) {
		t.Helper()
		s, err := r.admin.js.Stream(ctx(t, wait), stream)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := s.GetLastMsgForSubject(ctx(t, wait), subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("%s holds a message on %s (%v, %v)", stream, subject, m, err)
		}
	}
}

// noPublish: a publish on subject that must not be stored.
func (r refusals) noPublish(name string, c *client, stream, subject string) refusal {
	return refusal{name, c, subject, pub(c, subject), r.nothingOn(stream, subject)}
}

// noPut: a KV write that must not land (bucket is admin's handle, for the
// check).
func noPut(name string, c *client, bucket jetstream.KeyValue, key string) refusal {
	return refusal{name, c, kvPut(c, bucket.Bucket(), key), put(c, bucket.Bucket(), key), noKey(bucket, key)}
}

// noGet: a KV read that must not answer.
func noGet(name string, c *client, bucket, key string) refusal {
	return refusal{name, c, directGet(c, bucket, key), get(c, bucket, key), nothing}
}

// noWrite: a KV write to a bucket c may not even look up, sent as is
// (kv is admin's handle, for the check).
func noWrite(name string, c *client, kv jetstream.KeyValue, key string) refusal {
	return refusal{name, c, kvPut(c, kv.Bucket(), key), pub(c, kvPut(c, kv.Bucket(), key)), noKey(kv, key)}
}

// noRead: a KV get from a bucket c may not even look up, sent as is.
func noRead(name string, c *client, bucket, key string) refusal {
	return refusal{name, c, directGet(c, bucket, key), request(c, directGet(c, bucket, key)), nothing}
}

// noRequest: a request on subject that must not be answered.
func noRequest(name string, c *client, subject string) refusal {
	return refusal{name, c, subject, request(c, subject), nothing}
}

func noKey(kv jetstream.KeyValue, key string) func(*testing.T) {
	return func(t *testing.T) {
		t.Helper()
		if e, err := kv.Get(ctx(t, wait), key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("%s/%s exists (%v, %v)", kv.Bucket(), key, e, err)
		}
	}
}

func nothing(*testing.T) {} // a refused read changes nothing

func pub(c *client, subject string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.js.Publish(ctx, subject, []byte("forged"))
		return err
	}
}

// onKV binds c's handle on bucket (a stream look-up), then runs op with it.
func onKV(c *client, bucket string, op func(context.Context, jetstream.KeyValue) error) func(context.Context) error {
	return func(ctx context.Context) error {
		kv, err := c.js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		return op(ctx, kv)
	}
}

func put(c *client, bucket, key string) func(context.Context) error {
	return onKV(c, bucket, func(ctx context.Context, kv jetstream.KeyValue) error {
		_, err := kv.Put(ctx, key, []byte("forged"))
		return err
	})
}

func get(c *client, bucket, key string) func(context.Context) error {
	return onKV(c, bucket, func(ctx context.Context, kv jetstream.KeyValue) error {
		_, err := kv.Get(ctx, key)
		return err
	})
}

func request(c *client, subject string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.nc.RequestWithContext(ctx, subject, []byte("{}"))
		return err
	}
}

func kvSubj(bucket, key string) string { return "$KV." + bucket + "." + key }

// kvPut is the subject of a KV put as c sends it (under its account's API
// prefix).
func kvPut(c *client, bucket, key string) string {
	if p := accountOf(c.user).APIPrefix; p != "" {
		return p + "." + kvSubj(bucket, key)
	}
	return kvSubj(bucket, key)
}

// directGet is the subject of a KV get as c sends it.
func directGet(c *client, bucket, key string) string {
	return apiOf(c) + "DIRECT.GET.KV_" + bucket + "." + kvSubj(bucket, key)
}

func streamInfo(t *testing.T, admin *client, name string) *jetstream.StreamInfo {
	t.Helper()
	s, err := admin.js.Stream(ctx(t, wait), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(ctx(t, wait))
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return info
}

// kvRevision is key's revision in kv, 0 if absent.
func kvRevision(t *testing.T, kv jetstream.KeyValue, key string) uint64 {
	t.Helper()
	e, err := kv.Get(ctx(t, wait), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0
	}
	if err != nil {
		t.Fatalf("%s/%s: %v", kv.Bucket(), key, err)
	}
	return e.Revision()
}

// Only admin shares an account with the streams: every other user of
// least-privilege.conf is alone in an account without JetStream, so the
// server's answers to its requests come back into that account and never
// land on a subject of the streams' account (the reply-subject
// injection). Each process's own inboxes are the only replies it may
// subscribe to.
func TestEveryUserButAdminHasAnAccountWithoutTheStreams(t *testing.T) {
	ns := startServer(t)
	opts, err := server.ProcessConfigFile(confFile)
	if err != nil {
		t.Fatal(err)
	}
	accounts, holder := map[string]string{}, map[string]string{} // user -> account -> user
	for _, u := range opts.Users {
		if u.Account == nil {
			t.Fatalf("user %s has no account", u.Username)
		}
		if other, ok := holder[u.Account.Name]; ok {
			t.Errorf("users %s and %s share account %s", other, u.Username, u.Account.Name)
		}
		accounts[u.Username], holder[u.Account.Name] = u.Account.Name, u.Username
		var inboxes []string
		if u.Permissions != nil && u.Permissions.Subscribe != nil {
			for _, s := range u.Permissions.Subscribe.Allow {
				if strings.HasPrefix(s, "_INBOX") {
					inboxes = append(inboxes, s)
				}
			}
		}
		if want := accountOf(u.Username).InboxPrefix; want != "" && !slices.Equal(inboxes, []string{want + ".>"}) {
			t.Errorf("user %s may subscribe to the inboxes %v, want only %s.>", u.Username, inboxes, want)
		}
	}
	for user := range users {
		name, ok := accounts[user]
		if !ok {
			t.Errorf("no user %s", user)
			continue
		}
		acc, err := ns.LookupAccount(name)
		if err != nil {
			t.Fatal(err)
		}
		if js := acc.JetStreamEnabled(); js != (user == "admin") {
			t.Errorf("user %s's account %s: JetStream %v", user, name, js)
		}
	}
}
