package webhook_test

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

// ----- approvals' decisions in the bucket, as the approver keeps them -----

// revision is the last message of approval id's record in the approvals
// bucket's stream: its decision, once decided.
func revision(t *testing.T, env *jstest.Env, id string) *jetstream.RawStreamMsg {
	t.Helper()
	ctx := jstest.Ctx(t)
	s, err := env.JS.Stream(ctx, topology.StreamApprovals)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, topology.ApprovalRevisionSubject(id))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// publishedAt is the stored time of the message on subject in
// TOLLGATE_EVENTS.
func publishedAt(t *testing.T, env *jstest.Env, subject string) time.Time {
	t.Helper()
	ctx := jstest.Ctx(t)
	s, err := env.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	return m.Time
}

// once fails t unless each of ids was sent to path once (2xx or not).
func once(t *testing.T, rcv *receiver, path string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if n := len(sent(rcv, path, id)); n != 1 {
			t.Errorf("%s sent %d times, want once (all: %v)", id, n, firstIDs(rcv.requests(path)))
		}
	}
}

// heldBy waits until the subscriber's decisions consumer has held the
// message at seq for half a second: delivered to it and not settled (a
// delivery that is not held back is settled within milliseconds).
func heldBy(t *testing.T, env *jstest.Env, id string, seq uint64) {
	t.Helper()
	jstest.EventuallyState(t, wait, "the decisions consumer holds the decision", func() (bool, string) {
		ctx := jstest.Ctx(t)
		c, err := env.JS.Consumer(ctx, topology.StreamApprovals, webhook.DecidedDurable(id))
		if err != nil {
			return false, err.Error()
		}
		i, err := c.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		held := i.Delivered.Last != nil && time.Since(*i.Delivered.Last) > 500*time.Millisecond
		return held && i.Delivered.Stream >= seq && i.AckFloor.Stream < seq && i.NumAckPending == 1,
			fmt.Sprintf("delivered %d, ack floor %d, ack pending %d; the decision at %d", i.Delivered.Stream, i.AckFloor.Stream, i.NumAckPending, seq)
	})
}

// A decision kept only in the approvals bucket (the approver publishes no
// approval.decided) is sent once, after its request, as its published
// copy would be, and is: the same webhook-id and the same data, byte for
// byte, signed; its timestamp is when its revision was stored. The copy
// is sent by a dispatcher in a second deployment where the same decision
// is only published (no record of it in the bucket, as for a decision
// past retention).
func TestADecisionKeptOnlyInTheBucketIsSentAsItsPublishedCopyWould(t *testing.T) {
	secret := newSecret(t)
	a := loggedApproval("t-kept", 0, "cli", "s1")

	kept, published := jstest.Start(t), jstest.Start(t)
	rcv := newReceiver(t)
	startDispatcher(t, kept.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/kept"), Secret: secret, Transports: []string{"cli"}},
	}})
	startDispatcher(t, published.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/published"), Secret: secret, Sessions: []string{"s1"}},
	}})

	awaitInLog(t, kept, true, a)
	rec := record(t, kept, a) // no approval.decided
	stored := revision(t, kept, a.ApprovalID).Time
	id := topology.DecidedMsgID(a.ApprovalID)
	publish(t, published.JS, topology.EventSubject(topology.SubjectApprovalDecided, a.TurnID), id, schemas.DecidedOf(rec))
	want := rcv.waitFor("/published", id)
	got := rcv.waitFor("/kept", id)
	settled(t, kept, "ops")
	once(t, rcv, "/kept", topology.RequestedMsgID(a.ApprovalID), id)
	if ids := firstIDs(rcv.requests("/kept")); !slices.Equal(ids, []string{topology.RequestedMsgID(a.ApprovalID), id}) {
		t.Fatalf("webhook-ids in order of arrival = %v, want the request, then the decision", ids)
	}

	g, w := got[slices.IndexFunc(got, func(q request) bool { return q.ID() == id })], want[slices.IndexFunc(want, func(q request) bool { return q.ID() == id })]
	gb, wb := bodyOf(t, g), bodyOf(t, w)
	if gb.Type != "approval.decided" || gb.Type != wb.Type {
		t.Errorf("type %q, its published copy's %q", gb.Type, wb.Type)
	}
	if !bytes.Equal(gb.Data, wb.Data) {
		t.Errorf("data differs from its published copy's:\n got %s\nwant %s", gb.Data, wb.Data)
	}
	if !gb.Timestamp.Equal(stored) {
		t.Errorf("timestamp %v, want the revision's stored time %v", gb.Timestamp, stored)
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.Verify(g.Body, g.Header); err != nil {
		t.Errorf("the reference library refuses the kept decision's signature: %v", err)
	}
}

// Each decision is sent once, wherever it is kept: recorded and published
// (as the approver does today), from the bucket (its revision's
// timestamp); recorded only, from the bucket; recorded before the
// subscriber's decisions consumer was made and published after (its
// events consumer holds the copy, as after an upgrade), from the
// published copy; published only (no record), from the published copy.
// The approver's answer to a repeated decision (repeat set) is not sent
// again. A restart of the dispatcher sends nothing again.
func TestEachDecisionIsSentOnceWhereverItIsKept(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	cfg := webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}, Events: []webhook.Event{webhook.EventApprovalDecided}},
	}}
	before := approval("t-before", "cli", "s1")
	beforeRec := record(t, env, before) // its decisions consumer is not made yet
	d := startDispatcher(t, env.JS, cfg)

	both, only := approval("t-both", "cli", "s1"), approval("t-only", "cli", "s1")
	idBoth := decide(t, env, both)
	record(t, env, only)
	idBefore := topology.DecidedMsgID(before.ApprovalID)
	publish(t, env.JS, topology.EventSubject(topology.SubjectApprovalDecided, before.TurnID), idBefore, schemas.DecidedOf(beforeRec))
	idNone := publishDecided(t, env.JS, schemas.ApprovalID("t-none", 0), "t-none", "s1")
	// The approver's answer to a decision that repeated the recorded one,
	// stored past the duplicate window (no message id here).
	repeat := schemas.DecidedOf(record(t, env, approval("t-repeat", "cli", "s1")))
	idRepeat := topology.DecidedMsgID(repeat.ApprovalID)
	repeat.Repeat = "d-again"
	publish(t, env.JS, topology.EventSubject(topology.SubjectApprovalDecided, repeat.TurnID), "", repeat)

	// Each decision arrives (a missing one fails here, by name), then the
	// consumers settle, and nothing was sent twice. Settled alone once
	// passed in a loaded make test with the published-only decision
	// (idNone) not sent, and the check failed; it did not happen again in
	// 74 runs under load. Late or lost, this wait tells which: a late
	// one passes, a lost one still fails.
	ids := []string{idBoth, topology.DecidedMsgID(only.ApprovalID), idBefore, idNone, idRepeat}
	for _, id := range ids {
		rcv.waitFor("/in", id)
	}
	settled(t, env, "ops")
	once(t, rcv, "/in", ids...)
	stamp := func(id string) time.Time {
		i := slices.IndexFunc(rcv.requests("/in"), func(q request) bool { return q.ID() == id })
		if i < 0 {
			return time.Time{}
		}
		return bodyOf(t, rcv.requests("/in")[i]).Timestamp
	}
	if got, want := stamp(idBoth), revision(t, env, both.ApprovalID).Time; !got.Equal(want) {
		t.Errorf("%s: timestamp %v, want its revision's %v: not sent from the bucket", idBoth, got, want)
	}
	if got, want := stamp(idBefore), publishedAt(t, env, topology.EventSubject(topology.SubjectApprovalDecided, before.TurnID)); !got.Equal(want) {
		t.Errorf("%s: timestamp %v, want its published copy's %v", idBefore, got, want)
	}
	if got := d.deliveries(t, "ops", webhook.ResultDelivered); got != float64(len(ids)) {
		t.Errorf("delivered = %v, want %d", got, len(ids))
	}

	d.stop()
	startDispatcher(t, env.JS, cfg)
	marker := decide(t, env, approval("t-marker", "cli", "s1"))
	rcv.waitFor("/in", marker)
	settled(t, env, "ops")
	once(t, rcv, "/in", append(ids, marker)...)
}

// A decision recorded before its turn's batch moved to awaiting (an
// approval a standing grant decided as the executor created it) is not
// sent before its request: the decisions consumer holds it until the move
// that requests it is written, then the request is sent, then the
// decision.
func TestADecisionRecordedBeforeItsRequestComesAfterIt(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	startDispatcher(t, env.JS, webhook.Config{
		Subscribers: []webhook.Subscriber{{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}}},
		Timeout:     5 * time.Second, // the decision waits up to 7s past its revision for the move
	})
	ctx := jstest.Ctx(t)
	a := loggedApproval("t-granted", 0, "cli", "s1")
	log := batches(t, env).Log
	now := time.Now().UTC()
	b := &schemas.BatchRecord{TurnID: a.TurnID, SessionID: a.SessionID, State: schemas.BatchRunning, Context: a.Context,
		Calls:     []schemas.ToolCall{{CallID: a.CallID, Index: 0, Tool: a.Tool, Args: a.Args, ArgsDigest: a.ArgsDigest}},
		Approvals: []string{""}, Results: []*schemas.ToolResult{nil}, CreatedAt: now, UpdatedAt: now}
	rev, err := log.Create(ctx, a.TurnID, b)
	if err != nil {
		t.Fatal(err)
	}
	granted := *a
	granted.Status = schemas.ApprovalApproved
	granted.Decision = &schemas.DecisionInfo{DecisionID: "g-1", Principal: "cli:alice", Option: schemas.OptionApprove, DecidedAt: now}
	if _, err := store.New(env.Buckets).Approvals.Create(ctx, a.ApprovalID, &granted); err != nil {
		t.Fatal(err)
	}
	heldBy(t, env, "ops", revision(t, env, a.ApprovalID).Sequence)
	b.State, b.Approvals[0] = schemas.BatchAwaiting, a.ApprovalID
	b.Requested = []*schemas.ApprovalRecord{granted.AsRequested()}
	if _, err := log.Update(ctx, a.TurnID, b, rev); err != nil {
		t.Fatal(err)
	}
	req, dec := topology.RequestedMsgID(a.ApprovalID), topology.DecidedMsgID(a.ApprovalID)
	rcv.waitFor("/in", dec)
	settled(t, env, "ops")
	if got := firstIDs(rcv.requests("/in")); !slices.Equal(got, []string{req, dec}) {
		t.Fatalf("webhook-ids in order of arrival = %v, want %v", got, []string{req, dec})
	}
	once(t, rcv, "/in", req, dec)
}

// A decision kept only in the bucket whose request was published (a turn
// whose log keeps no request: an earlier version's, a batch kept in
// tollgate_batches) waits for the events consumer to deliver the request,
// which the receiver fails at first; then it is sent, once.
func TestADecisionFromTheBucketWaitsForItsPublishedRequest(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	a := approval("t-1", "cli", "s1")
	req := topology.RequestedMsgID(a.ApprovalID)
	rcv.answerBy(func(q request, earlier int) int {
		if q.ID() == req && earlier < 3 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	startDispatcher(t, env.JS, webhook.Config{
		Subscribers: []webhook.Subscriber{{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}}},
		Retry:       webhook.Retry{Attempts: 1000, Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		Timeout:     5 * time.Second,
	})
	requestApproval(t, env.JS, a)
	jstest.Eventually(t, wait, "the request's first attempt", func() bool { return len(sent(rcv, "/in", req)) > 0 })
	record(t, env, a) // no approval.decided
	dec := topology.DecidedMsgID(a.ApprovalID)
	reqs := rcv.waitFor("/in", dec)
	settled(t, env, "ops")
	ok := firstOK(reqs, req)
	if ok < 0 || firstTry(reqs, req) == ok {
		t.Fatalf("the request's first attempts did not fail as arranged: %v", firstIDs(reqs))
	}
	if d := firstTry(reqs, dec); d < ok {
		t.Fatalf("the decision was tried (request %d) before its request was delivered (request %d)", d, ok)
	}
	once(t, rcv, "/in", dec)
}

// A turn's outcome kept in its log does not overtake its decision kept
// in the bucket while the decision's delivery fails: the outcome waits for
// the decisions consumer to pass it. Each is sent once delivered.
func TestALoggedOutcomeWaitsForItsDecisionInTheBucket(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	a := loggedApproval("t-1", 0, "cli", "s1")
	dec := topology.DecidedMsgID(a.ApprovalID)
	rcv.answerBy(func(q request, earlier int) int {
		if q.ID() == dec && earlier < 3 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	startDispatcher(t, env.JS, webhook.Config{
		Subscribers: []webhook.Subscriber{{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}}},
		Retry:       webhook.Retry{Attempts: 1000, Base: 300 * time.Millisecond, Max: 300 * time.Millisecond},
		Timeout:     5 * time.Second,
	})
	awaitInLog(t, env, true, a)
	record(t, env, a) // no approval.decided
	jstest.Eventually(t, wait, "the decision's first attempt", func() bool { return len(sent(rcv, "/in", dec)) > 0 })
	out := finishInLog(t, env, a.TurnID)
	reqs := rcv.waitFor("/in", out)
	settled(t, env, "ops")
	req := topology.RequestedMsgID(a.ApprovalID)
	if got := firstIDs(reqs); !slices.Equal(got, []string{req, dec, out}) {
		t.Fatalf("webhook-ids in order of arrival = %v, want %v", got, []string{req, dec, out})
	}
	if ok, o := firstOK(reqs, dec), firstTry(reqs, out); ok < 0 || o < ok {
		t.Fatalf("the outcome was tried (request %d) before its turn's decision was delivered (request %d): %v", o, ok, firstIDs(reqs))
	}
	once(t, rcv, "/in", req, out)
}
