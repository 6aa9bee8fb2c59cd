package natsconf_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestLeastPrivilegeTurnLogs: the turn logs (issue 36) under the
// least-privilege accounts. The stages run as their own users and a turn
// with an approval goes through: the executor and the redriver append its
// batch records to its turn log, the gateway hears each append on its core
// subscription (stream imports from the writers' accounts) and reads the
// batch back from the log with its own handles, and the redriver's
// recovery sweep follows every turn-log stream (one ordered consumer
// each). Then the accounts that write no batch (ingest, the approver, the
// gateway, the cli transport) are refused an append, each through the
// code a writer uses where it can open the logs, and nothing lands; only
// the redriver may create a consumer on a turn log; the look-up-only
// accounts may not read one.
func TestLeastPrivilegeTurnLogs(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	stages, _ := runStages(t, ns, t.TempDir())
	gw := dial(t, ns, "gateway")
	cli := dial(t, ns, "cli")
	partitions := topology.DefaultConfig().TurnLogPartitionCount()

	// The gateway's subscription to the appends, made before the turn.
	live, err := gw.nc.SubscribeSync(topology.SubjectTurnLogPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	turn := send(t, cli, "m-turnlog", "s-turnlog", schemas.ProposedCall{Tool: "echo", Args: `{"text":"hi"}`},
		schemas.ProposedCall{Tool: "write_file", Args: `{"path":"t.txt","content":"1"}`})
	req := loggedRequest(t, admin, turn)
	d := &schemas.Decision{
		DecisionID: "d-turnlog", ApprovalID: req.ApprovalID, Transport: "cli",
		Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true},
		Option:  schemas.OptionApprove, ArgsDigest: req.ArgsDigest, SentAt: time.Now().UTC(),
	}
	publish(t, cli, topology.DecisionSubject("cli", req.ApprovalID), d.DecisionID, d)
	if o := loggedOutcome(t, admin, turn); o.State != schemas.TurnCompleted {
		t.Fatalf("outcome: %+v", o)
	}

	// The batch is in the turn's log, not in the batches bucket.
	p := topology.TurnLogPartition(turn, partitions)
	adminKV, err := topology.OpenBuckets(ctx(t, wait), admin.js)
	if err != nil {
		t.Fatal(err)
	}
	if len(adminKV.TurnLogs) != partitions {
		t.Fatalf("%d turn logs, want %d (least-privilege.conf grants TOLLGATE_TURNLOG_0 to _%d)", len(adminKV.TurnLogs), partitions, partitions-1)
	}
	if e, err := adminKV.Batches.Get(ctx(t, wait), turn); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("batch %s in the bucket: %v, %v; want it in its turn log", turn, e, err)
	}
	adminLog := turnlog.Bind(admin.js, adminKV.TurnLogs)
	last, err := adminLog.Last(ctx(t, wait), turn)
	if err != nil || last.Name != store.EventOutcome {
		t.Fatalf("the last event of %s: %+v, %v", turn, last, err)
	}

	// The gateway heard the appends, from the executor's account and the
	// redriver's: the executor's "awaiting", the redriver's "started" and
	// "outcome".
	var heard []string
	jstest.EventuallyState(t, wait, "the gateway hears the executor's and the redriver's appends", func() (bool, string) {
		for {
			m, err := live.NextMsg(10 * time.Millisecond)
			if err != nil {
				break
			}
			event, ok := strings.CutPrefix(m.Subject, topology.TurnLogSubject(p, turn, ""))
			if !ok {
				t.Fatalf("gateway: an append on %s, want only %s's", m.Subject, turn)
			}
			heard = append(heard, event)
		}
		for _, want := range []string{string(schemas.BatchAwaiting), string(schemas.BatchStarted), store.EventOutcome} {
			if !slices.Contains(heard, want) {
				return false, "heard " + strings.Join(heard, ", ")
			}
		}
		return true, ""
	})

	// The gateway reads the batch from the log: the raw last event, and
	// the record as its store reads it.
	gwKV, err := topology.OpenBuckets(ctx(t, wait), gw.js)
	if err != nil {
		t.Fatalf("gateway: open the buckets and turn logs: %v (server said %v)", err, gw.reported())
	}
	if ev, err := turnlog.Bind(gw.js, gwKV.TurnLogs).Last(ctx(t, wait), turn); err != nil || ev.Seq != last.Seq {
		t.Fatalf("gateway: the last event of %s: %+v, %v; want sequence %d (server said %v)", turn, ev, err, last.Seq, gw.reported())
	}
	gwStore := store.New(gwKV)
	b, rev, err := gwStore.Batches.Get(ctx(t, wait), turn)
	if err != nil || b.State != schemas.BatchCompleted || rev != last.Seq {
		t.Fatalf("gateway: the batch of %s: %+v @%d, %v", turn, b, rev, err)
	}

	// The redriver's sweep follows every turn log, on one ordered consumer
	// each (created under its grants), beside the CLI transport's outcome
	// consumer that admin provisioned.
	jstest.Eventually(t, wait, "the redriver's sweep is watching", func() bool {
		return stages["redriver"].p.Redriver.Sweeping() == nil
	})
	for i := range partitions {
		eventually(t, "one consumer on "+topology.TurnLogStream(i), func(c context.Context) bool {
			s, err := admin.js.Stream(c, topology.TurnLogStream(i))
			if err != nil {
				return false
			}
			info, err := s.Info(c)
			return err == nil && info.State.Consumers == 2
		})
	}

	for name, s := range stages {
		if errs := s.reported(); len(errs) > 0 {
			t.Errorf("stage %s was refused: %v", name, errs)
		}
	}
	for _, c := range []*client{gw, cli} {
		if errs := c.reported(); len(errs) > 0 {
			t.Errorf("%s was refused: %v", c.user, errs)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("refused", func(t *testing.T) {
		testTurnLogRefusals(t, admin, adminLog, stages, gw, cli, turn, b, rev)
	})
}

func testTurnLogRefusals(t *testing.T, admin *client, adminLog *turnlog.Log, stages map[string]*stage, gw, cli *client, turn string, b *schemas.BatchRecord, rev uint64) {
	ingest, executor, approver := stages["ingest"].client, stages["executor"].client, stages["approver"].client
	p := adminLog.Partition(turn)
	stream := topology.TurnLogStream(p)
	r := refusals{admin}

	// The forgery: the turn's completed batch rewritten as failed, appended
	// after its last event, as a writer's Update would.
	forged := *b
	forged.State = schemas.BatchFailed
	if b.Outcome != nil {
		o := *b.Outcome
		o.State = schemas.TurnFailed
		forged.Outcome = &o
	}
	forgedSubject := topology.TurnLogSubject(p, turn, store.EventOutcome)
	// batchKept: the turn's last event is still the one at rev.
	batchKept := func(t *testing.T) {
		t.Helper()
		if ev, err := adminLog.Last(ctx(t, wait), turn); err != nil || ev.Seq != rev {
			t.Fatalf("the last event of %s: %+v, %v; want still sequence %d", turn, ev, err, rev)
		}
	}
	// update writes the forgery as c's store does (c may open the logs).
	update := func(c *client) func(context.Context) error {
		return func(ctx context.Context) error {
			kv, err := topology.OpenBuckets(ctx, c.js)
			if err != nil {
				return err
			}
			_, err = store.New(kv).Batches.Update(ctx, turn, &forged, rev)
			return err
		}
	}
	// last reads the turn's last event as the stages' stores do.
	last := func(c *client) func(context.Context) error {
		return func(ctx context.Context) error {
			logs, err := topology.OpenTurnLogs(ctx, c.js)
			if err != nil {
				return err
			}
			_, err = turnlog.Bind(c.js, logs).Last(ctx, turn)
			return err
		}
	}
	directGetLast := func(c *client) string {
		return apiOf(c) + "DIRECT.GET." + stream + "." + topology.TurnLogWildcard(p, turn)
	}
	consumerCreate := func(c *client, name string) string {
		return apiOf(c) + "CONSUMER.CREATE." + stream + "." + name + "." + topology.SubjectTurnLogPrefix + strconv.Itoa(p) + ".>"
	}
	noConsumer := func(name string) func(*testing.T) {
		return func(t *testing.T) {
			t.Helper()
			if _, err := admin.js.Consumer(ctx(t, wait), stream, name); !errors.Is(err, jetstream.ErrConsumerNotFound) {
				t.Fatalf("consumer %s on %s: want not found, got %v", name, stream, err)
			}
		}
	}
	fresh := "t-turnlog-forged"
	freshSubject := topology.TurnLogSubject(topology.TurnLogPartition(fresh, adminLog.Partitions()), fresh, store.EventOutcome)

	cases := []refusal{
		// No account but the executor's, the redriver's and the planner's
		// appends to a turn log.
		{"ingest cannot append to a turn log", ingest, forgedSubject, update(ingest), batchKept},
		{"the approver cannot append to a turn log", approver, forgedSubject, update(approver), batchKept},
		{"the gateway cannot append to a turn log", gw, forgedSubject, update(gw), batchKept},
		{"cli cannot append to a turn log", cli, forgedSubject, pub(cli, forgedSubject), batchKept},
		r.noPublish("the approver cannot start a turn's log", approver,
			topology.TurnLogStream(topology.TurnLogPartition(fresh, adminLog.Partitions())), freshSubject),

		// Looking a turn log up is not reading it.
		{"ingest cannot read a turn log", ingest, directGetLast(ingest), last(ingest), nothing},
		{"the approver cannot read a turn log", approver, directGetLast(approver), last(approver), nothing},
		noRequest("cli cannot look a turn log up", cli, apiOf(cli)+"STREAM.INFO."+stream),

		// The redriver's sweep alone follows the turn logs.
		{"the gateway cannot create a consumer on a turn log", gw, consumerCreate(gw, "mine"),
			request(gw, consumerCreate(gw, "mine")), noConsumer("mine")},
		{"the executor cannot create a consumer on a turn log", executor, consumerCreate(executor, "mine"),
			request(executor, consumerCreate(executor, "mine")), noConsumer("mine")},
	}
	// Nobody but admin purges a turn's log.
	for _, c := range []*client{stages["executor"].client, stages["redriver"].client, gw} {
		purge := apiOf(c) + "STREAM.PURGE." + stream
		cases = append(cases, refusal{c.user + " cannot purge a turn log", c, purge, request(c, purge), batchKept})
	}
	runRefusals(t, cases)
}

// The turn-log grants, user by user, read from the file as nats-server
// loads it: every process that opens the buckets may look up each of the
// default number of turn-log streams (and no further one, which would mean
// the file and topology.DefaultTurnLogPartitions disagree); the stages that
// read batches and the gateway may read each stream's last event (direct
// and message get); only the writers may append, and only the redriver may
// follow the logs with consumers of any name and filter; the planner and
// the Slack and Discord transports follow the outcome events, each with
// durables of fixed names and the one filter, and the transports read an
// outcome event (a direct get of that subject alone, or a message get on
// replicas 3). Nobody else holds any turn-log subject.
func TestTurnLogGrantsNameEveryPartition(t *testing.T) {
	for user, env := range users {
		t.Setenv(env, password(user))
	}
	opts, err := server.ProcessConfigFile(confFile)
	if err != nil {
		t.Fatal(err)
	}
	n := topology.DefaultConfig().TurnLogPartitionCount()
	api := apiPrefix + "."
	lookups := []string{"ingest", "executor", "approver", "redriver", "planner", "gateway"}
	readers := []string{"executor", "redriver", "planner", "gateway"}
	writers := []string{"executor", "redriver", "planner"}
	want := map[string][]string{}
	for i := range n {
		stream, filter := topology.TurnLogStream(i), topology.SubjectTurnLogPrefix+strconv.Itoa(i)+".>"
		for _, u := range lookups {
			want[u] = append(want[u], api+"STREAM.INFO."+stream)
		}
		// A direct get by subject, and by sequence or next by subject
		// (a turn's earlier awaiting events: store.LoggedRequest), which
		// names no subject, as the message get does.
		for _, u := range readers {
			want[u] = append(want[u], api+"DIRECT.GET."+stream+"."+filter, api+"DIRECT.GET."+stream, api+"STREAM.MSG.GET."+stream)
		}
		want["redriver"] = append(want["redriver"], api+"CONSUMER.CREATE."+stream+".*."+filter,
			api+"CONSUMER.MSG.NEXT."+stream+".*", api+"CONSUMER.DELETE."+stream+".*")
		// The gateway's event feed (transport/eventfeed): ordered pull
		// consumers of the outcome events, all turns' or one turn's.
		// With the awaiting events too (two filters: the create request
		// names none), of any name; the deny list keeps it off the other
		// readers' durables.
		want["gateway"] = append(want["gateway"], api+"CONSUMER.CREATE."+stream+".*."+topology.SubjectTurnLogPrefix+strconv.Itoa(i)+".*.outcome",
			api+"CONSUMER.CREATE."+stream+".*",
			api+"CONSUMER.MSG.NEXT."+stream+".*", api+"CONSUMER.DELETE."+stream+".*",
			// and its webhooks' outcome followers, durables of any name.
			api+"CONSUMER.INFO."+stream+".*", "$JS.ACK."+stream+".*.>")
		// The outcome followers (pipeline/outcomes): a durable of a fixed
		// name created with the one filter of the outcome events, and for
		// the transports the look-up and the read of an outcome event.
		// The CLI transport's, which admin provisions: it may only pull.
		cli := outcomes.Durable("transport-cli", i)
		want["cli"] = append(want["cli"], api+"CONSUMER.INFO."+stream+"."+cli, api+"CONSUMER.MSG.NEXT."+stream+"."+cli, "$JS.ACK."+stream+"."+cli+".>")
		// The planner's follows the outcome events only; the chat
		// transports' follow the awaiting events too (their prompts), so
		// their create request names no filter (two), only the durable.
		for user, durable := range map[string]string{"planner": "planner", "slack": "transport-slack", "discord": "transport-discord"} {
			name := outcomes.Durable(durable, i)
			create := api + "CONSUMER.CREATE." + stream + "." + name
			if user == "planner" {
				create += "." + topology.TurnLogOutcomeFilter(i)
			}
			want[user] = append(want[user], create,
				api+"CONSUMER.INFO."+stream+"."+name, api+"CONSUMER.MSG.NEXT."+stream+"."+name, "$JS.ACK."+stream+"."+name+".>")
			if user != "planner" {
				want[user] = append(want[user], api+"STREAM.INFO."+stream,
					api+"DIRECT.GET."+stream+"."+topology.TurnLogOutcomeFilter(i), api+"DIRECT.GET."+stream+"."+topology.TurnLogAwaitingFilter(i),
					api+"DIRECT.GET."+stream, api+"STREAM.MSG.GET."+stream)
			}
		}
	}
	for _, u := range writers {
		want[u] = append(want[u], topology.SubjectTurnLogPrefix+"*.*.*")
	}
	seen := map[string]bool{}
	for _, u := range opts.Users {
		seen[u.Username] = true
		if u.Username == "admin" {
			continue // all of the JetStream API, in the streams' account
		}
		var got []string
		if u.Permissions != nil && u.Permissions.Publish != nil {
			for _, s := range u.Permissions.Publish.Allow {
				if strings.Contains(s, topology.StreamTurnLogPrefix) || strings.Contains(s, topology.SubjectTurnLogPrefix) {
					got = append(got, s)
				}
			}
		}
		slices.Sort(got)
		w := slices.Clone(want[u.Username])
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("user %s may publish on the turn logs:\n  %v\nwant\n  %v", u.Username, got, w)
		}
		var subs []string
		if u.Permissions != nil && u.Permissions.Subscribe != nil {
			for _, s := range u.Permissions.Subscribe.Allow {
				if strings.Contains(s, topology.SubjectTurnLogPrefix) {
					subs = append(subs, s)
				}
			}
		}
		var wantSubs []string // the appends, heard live: the gateway only
		if u.Username == "gateway" {
			wantSubs = []string{topology.SubjectTurnLogPrefix + ">"}
		}
		if !slices.Equal(subs, wantSubs) {
			t.Errorf("user %s may subscribe to %v on the turn logs, want %v", u.Username, subs, wantSubs)
		}
	}
	for u := range want {
		if !seen[u] {
			t.Errorf("no user %s", u)
		}
	}
}
