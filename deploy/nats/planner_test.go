package natsconf_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/schemas"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// The planner and the Slack transport under least-privilege.conf: admin
// provisions the planner's bucket (as `tollgate provision --planner` does)
// and the Slack transport's two buckets; the four stages and the planner
// run as their own users, ingest with --plan. The slack user, driving the
// transport's publishes, reads and writes its own buckets, sends a
// text-only message, follows its durable, reads the pending approval of
// the planner's step and approves it; the planner's reply and the turn's
// outcome follow, and nobody was refused anything. Then what the planner
// and slack users (and ingest's and the gateway's new neighbours) must not
// do is refused, and neither can aim a publish acknowledgement elsewhere.
func TestLeastPrivilegePlannerAndSlack(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	if _, err := topology.EnsurePlannerBucket(ctx(t, wait), admin.js, topology.DefaultConfig()); err != nil {
		t.Fatalf("admin: planner bucket: %v", err)
	}
	if _, _, err := tgslack.Provision(ctx(t, wait), admin.js, 1); err != nil {
		t.Fatalf("admin: slack buckets: %v", err)
	}
	model := plannertest.New(t)
	sandbox := filepath.Join(t.TempDir(), "sandbox")
	stages, stopStages := runStageSet(t, ns.ClientURL(), topology.DefaultConfig(), sandbox,
		append(tollgate.AllStages(), tollgate.StagePlanner), func(name string, cfg *tollgate.Config) {
			switch name {
			case tollgate.StageIngest:
				cfg.PlanText = true // ingest --plan
			case tollgate.StagePlanner:
				cfg.Planner = &planner.Options{Model: planner.ModelConfig{BaseURL: model.URL, Model: "scripted"}}
			}
		})
	sl := dial(t, ns, "slack")
	// The planner's view of the session records: its KV watch is allowed
	// (pipeline/batch/records.go).
	eventually(t, "the planner's view of the session records is current", func(context.Context) bool {
		return gauge(t, stages["planner"].reg, "tollgate_session_records_view_current") == 1
	})

	// ---- the Slack transport's own buckets: bound, read and written --
	seen, records, err := tgslack.Provision(ctx(t, wait), sl.js, 1)
	if err != nil {
		t.Fatalf("slack: bind its buckets: %v (server said: %v)", err, sl.reported())
	}
	for _, kv := range []jetstream.KeyValue{seen, records} {
		if _, err := kv.Create(ctx(t, wait), "lp-check", []byte("x")); err != nil {
			t.Fatalf("slack: create in %s: %v", kv.Bucket(), err)
		}
		if e, err := kv.Get(ctx(t, wait), "lp-check"); err != nil || string(e.Value()) != "x" {
			t.Fatalf("slack: read back from %s: %v", kv.Bucket(), err)
		}
	}
	events, err := sl.js.CreateOrUpdateConsumer(ctx(t, wait), topology.StreamEvents, jetstream.ConsumerConfig{
		Durable: tgslack.Durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverNewPolicy,
		FilterSubjects: []string{
			topology.SubjectApprovalDecided + "*", topology.SubjectApprovalRequested + "*",
			topology.SubjectDecisionRejected + "*", topology.SubjectTurnOutcome + "*", topology.SubjectTurnReply + "*",
		},
	})
	if err != nil {
		t.Fatalf("slack: create %s: %v", tgslack.Durable, err)
	}

	// ---- a planner turn with a gated tool, approved on Slack --------
	const text = "please note that the planner ran"
	model.Script(text,
		plannertest.Reply{Calls: []plannertest.Call{{Name: "write_file", Args: `{"path":"planned.txt","content":"planned for alice"}`}}},
		plannertest.Reply{Text: "Noted."})
	alice := schemas.Sender{ID: "U-alice", Display: "Alice", Kind: schemas.SenderUser, Verified: true}
	msg := &schemas.InboundMessage{
		Transport: tgslack.Name, MessageID: "m-planned", SessionID: "D-alice", Sender: alice,
		Channel: schemas.Channel{ID: "D-alice", Kind: schemas.ChannelDM}, Text: text, SentAt: time.Now().UTC(),
	}
	publish(t, sl, topology.InboundSubject(tgslack.Name, msg.SessionID), topology.InboundMsgID(tgslack.Name, msg.MessageID), msg)
	turn := schemas.TurnID(tgslack.Name, msg.MessageID)
	step := schemas.PlannerStepTurnID(turn, 0)

	// The request: the step batch's move to awaiting keeps it.
	req := loggedRequest(t, admin, step)
	if req.Tool != "write_file" || req.Context.Requester.Principal != "slack:U-alice" {
		t.Fatalf("approval requested: %+v", req)
	}
	// The transport checks a button against the pending record.
	approvals, err := sl.js.KeyValue(ctx(t, wait), topology.BucketApprovals)
	if err != nil {
		t.Fatalf("slack: approvals bucket: %v", err)
	}
	if e, err := approvals.Get(ctx(t, wait), req.ApprovalID); err != nil {
		t.Fatalf("slack: read approval %s: %v", req.ApprovalID, err)
	} else if a, err := schemas.Decode[schemas.ApprovalRecord](e.Value()); err != nil || a.Status != schemas.ApprovalPending {
		t.Fatalf("slack: approval %s: %+v, %v", req.ApprovalID, a, err)
	}
	d := &schemas.Decision{
		DecisionID: "d-slack", ApprovalID: req.ApprovalID, Transport: tgslack.Name, Decider: alice,
		Option: schemas.OptionApprove, ArgsDigest: req.ArgsDigest, SentAt: time.Now().UTC(),
	}
	publish(t, sl, topology.DecisionSubject(tgslack.Name, req.ApprovalID), topology.DecisionMsgID(d.DecisionID), d)

	reply, err := schemas.Decode[schemas.ReplyEvent](nextEvent(t, events, topology.SubjectTurnReply+turn))
	if err != nil || reply.Text != "Noted." || reply.Reply.Transport != tgslack.Name || reply.Steps != 2 {
		t.Fatalf("reply: %+v, %v", reply, err)
	}
	if o := loggedOutcome(t, admin, turn); o.State != schemas.TurnCompleted {
		t.Fatalf("outcome of %s: %+v", turn, o)
	}
	if b, err := os.ReadFile(filepath.Join(sandbox, "planned.txt")); err != nil || string(b) != "planned for alice" {
		t.Fatalf("the approved write_file did not run: %q, %v", b, err)
	}
	if got := model.Requests(text); len(got) != 2 || len(got[1].ToolResults()) != 1 {
		t.Fatalf("model requests: %+v; want two, the second with the call's result", got)
	}

	// Every consumer drained, and nobody was refused on the way.
	for _, d := range append(topology.Consumers(), append(topology.PlannerConsumers(), topology.IngestStepsConsumer())...) {
		caughtUp(t, admin, d.Stream, d.Config.Durable)
	}
	for name, s := range stages {
		if errs := s.reported(); len(errs) > 0 {
			t.Errorf("stage %s was refused: %v", name, errs)
		}
	}
	if errs := sl.reported(); len(errs) > 0 {
		t.Errorf("transport slack was refused: %v", errs)
	}
	if t.Failed() {
		t.FailNow()
	}

	adminKV, err := topology.OpenBuckets(ctx(t, wait), admin.js)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("refused", func(t *testing.T) {
		testPlannerAndSlackRefusals(t, ns.ClientURL(), admin, adminKV, stages, sl, turn)
	})
	t.Run("a step batch the planner forges never becomes an accepted turn", func(t *testing.T) {
		testForgedStepBatches(t, admin, stages["planner"].client, req.Context)
	})
	seenErrs := map[*client]int{}
	for _, s := range stages {
		seenErrs[s.client] = len(s.reported())
	}

	for _, p := range []struct {
		c       *client
		subject string
	}{{stages["planner"].client, topology.DLQSubject("planner")}, {sl, topology.DLQSubject(tgslack.Name)}} {
		t.Run(p.c.user+" cannot aim a publish acknowledgement at a KV key or a stream subject", func(t *testing.T) {
			noReplyInjection(t, admin, adminKV, p.c, p.subject)
		})
	}

	t.Run("the stages stop cleanly within their grants", func(t *testing.T) {
		stopStages()
		for name, s := range stages {
			if errs := s.reported()[seenErrs[s.client]:]; len(errs) > 0 {
				t.Errorf("stage %s was refused: %v", name, errs)
			}
		}
	})
}

func testPlannerAndSlackRefusals(t *testing.T, url string, admin *client, adminKV topology.Buckets, stages map[string]*stage, sl *client, turn string) {
	pl, ingest := stages["planner"].client, stages["ingest"].client
	gw := dialURL(t, url, "gateway")
	r := refusals{admin}
	adminKVOf := func(bucket string) jetstream.KeyValue {
		kv, err := admin.js.KeyValue(ctx(t, wait), bucket)
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	plannerKV, slackKV := adminKVOf(topology.BucketPlanner), adminKVOf(tgslack.BucketRecords)
	consumerKept := func(stream, durable string) func(*testing.T) {
		return func(t *testing.T) {
			t.Helper()
			if _, err := admin.js.Consumer(ctx(t, wait), stream, durable); err != nil {
				t.Fatalf("consumer %s/%s: %v", stream, durable, err)
			}
		}
	}
	const forged = "t-forged"
	forgedSession := "s-forged"
	conversation := schemas.ConversationKey(schemas.SessionKey(tgslack.Name, "D-alice"))
	drifted := topology.DefaultConfig()
	drifted.Storage = jetstream.MemoryStorage

	cases := []refusal{
		r.noPublish("planner cannot publish an accepted turn", pl, topology.StreamTurns, topology.AcceptedSubject(forgedSession)),
		r.noPublish("planner cannot publish a planner turn", pl, topology.StreamTurns, topology.PlanSubject(forgedSession)),
		r.noPublish("planner cannot append to a session's order", pl, topology.StreamTurns, topology.OrderSubject(topology.OrderPlan, forgedSession)),
		r.noPublish("planner cannot schedule a message", pl, topology.StreamTurns, topology.SubjectTurnSchedule+forged+"-p0"),
		r.noPublish("planner cannot publish an inbound message", pl, topology.StreamInbound, topology.InboundSubject("cli", forgedSession)),
		r.noPublish("planner cannot submit a decision", pl, topology.StreamDecisions, topology.DecisionSubject(tgslack.Name, "a-forged-0")),
		r.noPublish("planner cannot request an approval", pl, topology.StreamEvents, topology.EventSubject(topology.SubjectApprovalRequested, forged)),
		r.noPublish("planner cannot publish a decision rejection", pl, topology.StreamEvents, topology.EventSubject(topology.SubjectDecisionRejected, "a-forged-0")),
		r.noPublish("planner cannot dead-letter as another stage", pl, topology.StreamDLQ, topology.DLQSubject("executor")),
		noPut("planner cannot write a claim", pl, adminKV.Claims, forged+"-0"),
		noWrite("planner cannot write the Slack transport's bucket", pl, slackKV, "forged"),
		noRead("planner cannot read the Slack transport's bucket", pl, tgslack.BucketRecords, "lp-check"),
		noRequest("planner cannot call a tool", pl, "tollgate.tool.deploys.deploy"),
		noRequest("planner cannot pull from the executor's consumer", pl, apiOf(pl)+"CONSUMER.MSG.NEXT.TOLLGATE_TURNS.executor"),
		noRequest("planner cannot create a consumer but its own", pl, apiOf(pl)+"CONSUMER.CREATE.TOLLGATE_TURNS.mine"),
		{"the planner cannot reconfigure its bucket", pl, apiOf(pl) + "STREAM.UPDATE.KV_" + topology.BucketPlanner,
			func(ctx context.Context) error {
				_, err := topology.EnsurePlannerBucket(ctx, pl.js, drifted)
				return err
			},
			func(t *testing.T) {
				if got := streamInfo(t, admin, "KV_"+topology.BucketPlanner); got.Config.Storage != jetstream.FileStorage {
					t.Fatalf("planner bucket storage is now %v", got.Config.Storage)
				}
			}},

		r.noPublish("slack cannot publish a message as the cli transport", sl, topology.StreamInbound, topology.InboundSubject("cli", forgedSession)),
		r.noPublish("slack cannot decide as the cli transport", sl, topology.StreamDecisions, topology.DecisionSubject("cli", "a-forged-0")),
		r.noPublish("slack cannot publish an accepted turn", sl, topology.StreamTurns, topology.AcceptedSubject(forgedSession)),
		r.noPublish("slack cannot publish a planner turn", sl, topology.StreamTurns, topology.PlanSubject(forgedSession)),
		r.noPublish("slack cannot append to a session's order", sl, topology.StreamTurns, topology.OrderSubject(topology.OrderExec, forgedSession)),
		r.noPublish("slack cannot publish a step batch", sl, topology.StreamTurns, topology.StepSubject(forged+"-p0")),
		r.noPublish("slack cannot publish a reply", sl, topology.StreamEvents, topology.SubjectTurnReply+forged),
		r.noPublish("slack cannot dead-letter as another stage", sl, topology.StreamDLQ, topology.DLQSubject("approver")),
		noPut("slack cannot write an approval", sl, adminKV.Approvals, "a-forged-0"),
		noWrite("slack cannot write a batch", sl, adminKV.Batches, forged),
		noWrite("slack cannot write the planner's bucket", sl, plannerKV, "forged"),
		noRead("slack cannot read a batch", sl, topology.BucketBatches, turn),
		noRead("slack cannot read the planner's bucket", sl, topology.BucketPlanner, conversation),
		noRequest("slack cannot pull from the cli transport's consumer", sl, apiOf(sl)+"CONSUMER.MSG.NEXT.TOLLGATE_EVENTS."+cliConsumer),
		{"slack cannot create a stream", sl, apiOf(sl) + "STREAM.CREATE.KV_forged", request(sl, apiOf(sl)+"STREAM.CREATE.KV_forged"),
			func(t *testing.T) {
				if _, err := admin.js.Stream(ctx(t, wait), "KV_forged"); !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Fatalf("stream KV_forged: want not found, got %v", err)
				}
			}},

		r.noPublish("ingest cannot announce a planner loop", ingest, topology.StreamTurns, topology.PlanReadySubject(forgedSession)),
		r.noPublish("ingest cannot publish a step batch", ingest, topology.StreamTurns, topology.StepSubject(forged+"-p0")),
		r.noPublish("the gateway cannot publish a step batch", gw, topology.StreamTurns, topology.StepSubject(forged+"-p0")),

		noRequest("the gateway cannot pull from the planner's consumer", gw, apiOf(gw)+"CONSUMER.MSG.NEXT.TOLLGATE_EVENTS."+topology.ConsumerPlannerOutcomes),
		noRequest("the gateway cannot pull from the Slack transport's consumer", gw, apiOf(gw)+"CONSUMER.MSG.NEXT.TOLLGATE_EVENTS."+tgslack.Durable),
		{"the gateway cannot delete the planner's consumer", gw, apiOf(gw) + "CONSUMER.DELETE.TOLLGATE_EVENTS." + topology.ConsumerPlannerOutcomes,
			request(gw, apiOf(gw)+"CONSUMER.DELETE.TOLLGATE_EVENTS."+topology.ConsumerPlannerOutcomes),
			consumerKept(topology.StreamEvents, topology.ConsumerPlannerOutcomes)},
		{"the gateway cannot delete the Slack transport's consumer", gw, apiOf(gw) + "CONSUMER.DELETE.TOLLGATE_EVENTS." + tgslack.Durable,
			request(gw, apiOf(gw)+"CONSUMER.DELETE.TOLLGATE_EVENTS."+tgslack.Durable),
			consumerKept(topology.StreamEvents, tgslack.Durable)},
	}
	runRefusals(t, cases)
}

// testForgedStepBatches: the planner may publish step batches, and only
// ingest makes accepted turns of them. Step batches the planner user forges
// (the planner turn's own sealed context under another turn's step id; the
// same context with its audience widened) are dead-lettered by ingest, and
// the session's accepted subject holds nothing new.
func testForgedStepBatches(t *testing.T, admin, pl *client, tc *schemas.TurnContext) {
	accepted := topology.AcceptedSubject(schemas.SessionKeyOf(tc))
	before := stored(t, admin, topology.StreamTurns, accepted)
	dead := stored(t, admin, topology.StreamDLQ, topology.DLQSubject("ingest"))
	call := schemas.ToolCall{CallID: "c-forged", Tool: "write_file", Args: `{"content":"x","path":"forged.txt"}`}
	_, call.ArgsDigest, _ = schemas.CanonicalArgs(call.Args)
	widened := *tc
	widened.Audience = schemas.AudiencePublic
	for _, s := range []*schemas.AcceptedTurn{
		{TurnID: "t-forged-p0", Origin: "t-forged", Context: tc, Calls: []schemas.ToolCall{call}, AcceptedAt: time.Now().UTC()},
		{TurnID: tc.TurnID + "-p7", Origin: tc.TurnID, Context: &widened, Calls: []schemas.ToolCall{call}, AcceptedAt: time.Now().UTC()},
	} {
		publish(t, pl, topology.StepSubject(s.TurnID), topology.StepMsgID(s.TurnID), s)
	}
	eventually(t, "ingest dead-letters both", func(context.Context) bool {
		return stored(t, admin, topology.StreamDLQ, topology.DLQSubject("ingest")) == dead+2
	})
	if n := stored(t, admin, topology.StreamTurns, accepted); n != before {
		t.Fatalf("%d accepted turns on %s, want still %d", n, accepted, before)
	}
}
