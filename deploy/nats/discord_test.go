package natsconf_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/decisions"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/schemas"
	tgdiscord "github.com/tollgate-dev/tollgate/transport/discord"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// The Discord transport under least-privilege.conf: admin creates its two
// buckets (and the Slack transport's, to show the two apart); the four
// stages run as their own users. The discord user, driving the
// transport's publishes, binds and reads and writes its own buckets,
// creates its durable, sends a message with a gated call, reads the
// pending approval and approves it; the turn completes and nobody was
// refused anything. Then what the discord user must not do (another
// transport's subjects, buckets and consumer; the pipeline's buckets;
// streams) is refused, the slack and gateway users are kept off its
// bucket and durable, and it cannot aim a publish acknowledgement
// elsewhere.
func TestLeastPrivilegeDiscord(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	if _, _, err := tgdiscord.Provision(ctx(t, wait), admin.js, 1); err != nil {
		t.Fatalf("admin: discord buckets: %v", err)
	}
	if _, _, err := tgslack.Provision(ctx(t, wait), admin.js, 1); err != nil {
		t.Fatalf("admin: slack buckets: %v", err)
	}
	sandbox := filepath.Join(t.TempDir(), "sandbox")
	stages, _ := runStages(t, ns, sandbox)
	dc := dial(t, ns, "discord")

	// ---- the Discord transport's own buckets: bound, read and written
	seen, records, err := tgdiscord.Provision(ctx(t, wait), dc.js, 1)
	if err != nil {
		t.Fatalf("discord: bind its buckets: %v (server said: %v)", err, dc.reported())
	}
	for _, kv := range []jetstream.KeyValue{seen, records} {
		if _, err := kv.Create(ctx(t, wait), "lp-check", []byte("x")); err != nil {
			t.Fatalf("discord: create in %s: %v", kv.Bucket(), err)
		}
		if e, err := kv.Get(ctx(t, wait), "lp-check"); err != nil || string(e.Value()) != "x" {
			t.Fatalf("discord: read back from %s: %v", kv.Bucket(), err)
		}
	}
	_, err = dc.js.CreateOrUpdateConsumer(ctx(t, wait), topology.StreamEvents, jetstream.ConsumerConfig{
		Durable: tgdiscord.Durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverNewPolicy,
		FilterSubjects: []string{
			topology.SubjectApprovalRequested + "*",
			topology.SubjectDecisionRejected + "*", topology.SubjectTurnOutcome + "*", topology.SubjectTurnReply + "*",
		},
	})
	if err != nil {
		t.Fatalf("discord: create %s: %v", tgdiscord.Durable, err)
	}

	// ---- a turn with a gated tool, approved on Discord ----------------
	alice := schemas.Sender{ID: "111", Kind: schemas.SenderUser, Verified: true}
	msg := &schemas.InboundMessage{
		Transport: tgdiscord.Name, MessageID: "1001", SessionID: "discord:C1:1001", Sender: alice,
		Channel: schemas.Channel{ID: "C1", Kind: schemas.ChannelDM}, Text: "please", SentAt: time.Now().UTC(),
		Calls: []schemas.ProposedCall{{Tool: "write_file", Args: `{"path":"discord.txt","content":"approved on discord"}`}},
	}
	publish(t, dc, topology.InboundSubject(tgdiscord.Name, msg.SessionID), topology.InboundMsgID(tgdiscord.Name, msg.MessageID), msg)
	turn := schemas.TurnID(tgdiscord.Name, msg.MessageID)

	// The request: the batch's move to awaiting keeps it.
	req := loggedRequest(t, admin, turn)
	if req.Tool != "write_file" || req.Context.Requester.Principal != "discord:111" {
		t.Fatalf("approval requested: %+v", req)
	}
	// The transport checks a click against the pending record.
	approvals, err := dc.js.KeyValue(ctx(t, wait), topology.BucketApprovals)
	if err != nil {
		t.Fatalf("discord: approvals bucket: %v", err)
	}
	if e, err := approvals.Get(ctx(t, wait), req.ApprovalID); err != nil {
		t.Fatalf("discord: read approval %s: %v", req.ApprovalID, err)
	} else if a, err := schemas.Decode[schemas.ApprovalRecord](e.Value()); err != nil || a.Status != schemas.ApprovalPending {
		t.Fatalf("discord: approval %s: %+v, %v", req.ApprovalID, a, err)
	}
	d := &schemas.Decision{
		DecisionID: tgdiscord.DecisionPrefix + "lp", ApprovalID: req.ApprovalID, Transport: tgdiscord.Name, Decider: alice,
		Option: schemas.OptionApprove, ArgsDigest: req.ArgsDigest, SentAt: time.Now().UTC(),
	}
	publish(t, dc, topology.DecisionSubject(tgdiscord.Name, req.ApprovalID), topology.DecisionMsgID(d.DecisionID), d)

	// The request, then the outcome, from the transport's follower of its
	// turn log's partition, which its user may create with its two
	// filters (transport/chat: outcomes, with requests).
	part := topology.TurnLogPartition(turn, topology.DefaultTurnLogPartitions)
	follower, err := dc.js.CreateConsumer(ctx(t, wait), topology.TurnLogStream(part), jetstream.ConsumerConfig{
		Durable: outcomes.Durable(tgdiscord.Durable, part), AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubjects: []string{topology.TurnLogOutcomeFilter(part), topology.TurnLogAwaitingFilter(part)},
	})
	if err != nil {
		t.Fatalf("discord: create its outcome consumer: %v", err)
	}
	if got := nextRequests(t, follower, turn); len(got) != 1 || got[0].ApprovalID != req.ApprovalID || got[0].ArgsDigest != req.ArgsDigest {
		t.Fatalf("requests from the log: %+v, want %s", got, req.ApprovalID)
	}
	out := nextOutcome(t, follower, turn)
	if out.State != schemas.TurnCompleted || len(out.Results) != 1 || out.Results[0].Status != schemas.ResultOK {
		t.Fatalf("outcome of %s: %+v", turn, out)
	}
	// The decision, from the transport's own durable on the approvals
	// bucket's stream (transport/chat closes the prompt on it).
	decided, err := dc.js.CreateOrUpdateConsumer(ctx(t, wait), topology.StreamApprovals, jetstream.ConsumerConfig{
		Durable: decisions.Durable(tgdiscord.Durable), AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: topology.ApprovalRevisions,
	})
	if err != nil {
		t.Fatalf("discord: create its decisions consumer: %v", err)
	}
	if ev := nextDecision(t, decided, req.ApprovalID); ev.Status != schemas.ApprovalApproved || ev.Decision == nil || ev.Decision.DecisionID != d.DecisionID {
		t.Fatalf("decision: %+v", ev)
	}
	if b, err := os.ReadFile(filepath.Join(sandbox, "discord.txt")); err != nil || string(b) != "approved on discord" {
		t.Fatalf("the approved write_file did not run: %q, %v", b, err)
	}

	// Every consumer drained, and nobody was refused on the way.
	for _, c := range topology.Consumers() {
		caughtUp(t, admin, c.Stream, c.Config.Durable)
	}
	for name, s := range stages {
		if errs := s.reported(); len(errs) > 0 {
			t.Errorf("stage %s was refused: %v", name, errs)
		}
	}
	if errs := dc.reported(); len(errs) > 0 {
		t.Errorf("transport discord was refused: %v", errs)
	}
	if t.Failed() {
		t.FailNow()
	}

	adminKV, err := topology.OpenBuckets(ctx(t, wait), admin.js)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("refused", func(t *testing.T) {
		testDiscordRefusals(t, ns.ClientURL(), admin, adminKV, dc, turn)
	})
	t.Run("discord cannot aim a publish acknowledgement at a KV key or a stream subject", func(t *testing.T) {
		noReplyInjection(t, admin, adminKV, dc, topology.DLQSubject(tgdiscord.Name))
	})
}

func testDiscordRefusals(t *testing.T, url string, admin *client, adminKV topology.Buckets, dc *client, turn string) {
	sl, gw := dialURL(t, url, "slack"), dialURL(t, url, "gateway")
	r := refusals{admin}
	adminKVOf := func(bucket string) jetstream.KeyValue {
		kv, err := admin.js.KeyValue(ctx(t, wait), bucket)
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	discordKV, slackKV := adminKVOf(tgdiscord.BucketRecords), adminKVOf(tgslack.BucketRecords)
	consumerKept := func(durable string) func(*testing.T) {
		return func(t *testing.T) {
			t.Helper()
			if _, err := admin.js.Consumer(ctx(t, wait), topology.StreamEvents, durable); err != nil {
				t.Fatalf("consumer %s/%s: %v", topology.StreamEvents, durable, err)
			}
		}
	}
	const forged = "t-forged"
	forgedSession := "s-forged"

	cases := []refusal{
		r.noPublish("discord cannot publish a message as the Slack transport", dc, topology.StreamInbound, topology.InboundSubject(tgslack.Name, forgedSession)),
		r.noPublish("discord cannot publish a message as the cli transport", dc, topology.StreamInbound, topology.InboundSubject("cli", forgedSession)),
		r.noPublish("discord cannot decide as the Slack transport", dc, topology.StreamDecisions, topology.DecisionSubject(tgslack.Name, "a-forged-0")),
		r.noPublish("discord cannot decide as the web approval inbox", dc, topology.StreamDecisions, topology.DecisionSubject("web", "a-forged-0")),
		r.noPublish("discord cannot publish an accepted turn", dc, topology.StreamTurns, topology.AcceptedSubject(forgedSession)),
		r.noPublish("discord cannot append to a session's order", dc, topology.StreamTurns, topology.OrderSubject(topology.OrderExec, forgedSession)),
		r.noPublish("discord cannot publish a turn outcome", dc, topology.StreamEvents, topology.EventSubject(topology.SubjectTurnOutcome, forged)),
		r.noPublish("discord cannot dead-letter as the Slack transport", dc, topology.StreamDLQ, topology.DLQSubject(tgslack.Name)),
		noPut("discord cannot write an approval", dc, adminKV.Approvals, "a-forged-0"),
		noWrite("discord cannot write a batch", dc, adminKV.Batches, forged),
		noRead("discord cannot read a batch", dc, topology.BucketBatches, turn),
		noWrite("discord cannot write the Slack transport's bucket", dc, slackKV, "forged"),
		noRead("discord cannot read the Slack transport's bucket", dc, tgslack.BucketRecords, "lp-check"),
		noRequest("discord cannot pull from the cli transport's consumer", dc, apiOf(dc)+"CONSUMER.MSG.NEXT.TOLLGATE_EVENTS."+cliConsumer),
		{"discord cannot create the Slack transport's consumer", dc, apiOf(dc) + "CONSUMER.CREATE.TOLLGATE_EVENTS." + tgslack.Durable,
			func(ctx context.Context) error {
				_, err := dc.js.CreateOrUpdateConsumer(ctx, topology.StreamEvents, jetstream.ConsumerConfig{Durable: tgslack.Durable, AckPolicy: jetstream.AckExplicitPolicy})
				return err
			},
			func(t *testing.T) {
				if _, err := admin.js.Consumer(ctx(t, wait), topology.StreamEvents, tgslack.Durable); !errors.Is(err, jetstream.ErrConsumerNotFound) {
					t.Fatalf("consumer %s: want not found, got %v", tgslack.Durable, err)
				}
			}},
		{"discord cannot create a stream", dc, apiOf(dc) + "STREAM.CREATE.KV_forged", request(dc, apiOf(dc)+"STREAM.CREATE.KV_forged"),
			func(t *testing.T) {
				if _, err := admin.js.Stream(ctx(t, wait), "KV_forged"); !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Fatalf("stream KV_forged: want not found, got %v", err)
				}
			}},

		r.noPublish("slack cannot publish a message as the Discord transport", sl, topology.StreamInbound, topology.InboundSubject(tgdiscord.Name, forgedSession)),
		r.noPublish("slack cannot decide as the Discord transport", sl, topology.StreamDecisions, topology.DecisionSubject(tgdiscord.Name, "a-forged-0")),
		noWrite("slack cannot write the Discord transport's bucket", sl, discordKV, "forged"),
		noRequest("slack cannot pull from the Discord transport's consumer", sl, apiOf(sl)+"CONSUMER.MSG.NEXT.TOLLGATE_EVENTS."+tgdiscord.Durable),

		noRequest("the gateway cannot pull from the Discord transport's consumer", gw, apiOf(gw)+"CONSUMER.MSG.NEXT.TOLLGATE_EVENTS."+tgdiscord.Durable),
		{"the gateway cannot delete the Discord transport's consumer", gw, apiOf(gw) + "CONSUMER.DELETE.TOLLGATE_EVENTS." + tgdiscord.Durable,
			request(gw, apiOf(gw)+"CONSUMER.DELETE.TOLLGATE_EVENTS."+tgdiscord.Durable),
			consumerKept(tgdiscord.Durable)},
	}
	runRefusals(t, cases)
}
