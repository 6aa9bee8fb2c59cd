package webhook_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

// ----- turns' requests in their logs, as the executor keeps them -----

// loggedApproval is the pending approval of call i of turn on transport
// in session, as the executor stores it: versioned, its digest its
// arguments', with a preview whose text no webhook may carry.
func loggedApproval(turn string, i int, transport, session string) *schemas.ApprovalRecord {
	a := approval(turn, transport, session)
	a.V = schemas.ApprovalVersion
	a.ApprovalID, a.CallID = schemas.ApprovalID(turn, i), schemas.CallID(turn, i)
	a.Args = fmt.Sprintf(`{"path":"f%d.txt"}`, i)
	a.ArgsDigest = schemas.ArgsDigest(a.Args)
	a.Preview = &schemas.ApprovalPreview{Status: schemas.PreviewOK, Kind: "diff", Text: "-salary 123456\n+x\n", At: time.Now().UTC()}
	return a
}

// batches is the store of env's batches.
func batches(t *testing.T, env *jstest.Env) store.Batches {
	t.Helper()
	b, err := topology.OpenBuckets(jstest.Ctx(t), env.JS)
	if err != nil {
		t.Fatal(err)
	}
	return store.New(b).Batches
}

// awaitInLog creates the batch of the turn of as (approvals of one turn,
// call i for as[i]) in its log and moves it to awaiting as the executor
// does: keep says whether the move keeps the requests (an earlier
// version's does not; it only published them). It returns the awaiting
// event's sequence and stored time.
func awaitInLog(t *testing.T, env *jstest.Env, keep bool, as ...*schemas.ApprovalRecord) (uint64, time.Time) {
	t.Helper()
	ctx := jstest.Ctx(t)
	log := batches(t, env).Log
	turn, now := as[0].TurnID, time.Now().UTC()
	b := &schemas.BatchRecord{TurnID: turn, SessionID: as[0].SessionID, State: schemas.BatchRunning, Context: as[0].Context,
		CreatedAt: now, UpdatedAt: now}
	for i, a := range as {
		b.Calls = append(b.Calls, schemas.ToolCall{CallID: a.CallID, Index: i, Tool: a.Tool, Args: a.Args, ArgsDigest: a.ArgsDigest})
		b.Approvals, b.Results = append(b.Approvals, ""), append(b.Results, nil)
	}
	rev, err := log.Create(ctx, turn, b)
	if err != nil {
		t.Fatal(err)
	}
	b.State = schemas.BatchAwaiting
	for i, a := range as {
		b.Approvals[i] = a.ApprovalID
		if keep {
			b.Requested = append(b.Requested, a.AsRequested())
		}
	}
	if _, err := log.Update(ctx, turn, b, rev); err != nil {
		t.Fatal(err)
	}
	p := topology.TurnLogPartition(turn, len(env.Buckets.TurnLogs))
	m, err := env.Buckets.TurnLogs[p].GetLastMsgForSubject(ctx, topology.TurnLogSubject(p, turn, store.EventAwaiting))
	if err != nil {
		t.Fatal(err)
	}
	return m.Sequence, m.Time
}

// finishInLog ends turn's awaiting batch with its outcome, replied to its
// context's transport, as the redriver does (a result for each call); it
// returns the outcome's webhook-id.
func finishInLog(t *testing.T, env *jstest.Env, turn string) string {
	t.Helper()
	_, _, err := batches(t, env).Log.Mutate(jstest.Ctx(t), turn, func(b *schemas.BatchRecord) error {
		b.State, b.UpdatedAt = schemas.BatchCompleted, time.Now().UTC()
		results := []schemas.ToolResult{}
		for i := range b.Calls {
			r := resultOf(turn, i)
			b.Results[i], results = &r, append(results, r)
		}
		b.Outcome = &schemas.TurnOutcome{V: schemas.TurnOutcomeVersion, TurnID: turn, SessionID: b.SessionID, State: schemas.TurnCompleted,
			Results: results, Audience: schemas.AudiencePersonal, FinishedAt: b.UpdatedAt,
			Reply: schemas.ReplyTarget{Transport: b.Context.Transport, Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return topology.OutcomeMsgID(turn)
}

// publishRequested publishes a's approval-requested event as the executor
// does (its preview summary-only) and returns its webhook-id.
func publishRequested(t *testing.T, js jetstream.JetStream, a *schemas.ApprovalRecord) string {
	t.Helper()
	return requestApproval(t, js, a.SummaryOnly())
}

// settled waits until every consumer of subscriber id (on the events
// stream, the turn logs and the approvals bucket's stream) has nothing
// left to deliver or to ack: every event stored so far has been sent, or
// passed over, for good.
func settled(t *testing.T, env *jstest.Env, id string) {
	t.Helper()
	ctx := jstest.Ctx(t)
	idle := func(s jetstream.Stream, name string) (bool, string) {
		c, err := s.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return true, ""
		}
		if err != nil {
			return false, name + ": " + err.Error()
		}
		i := c.CachedInfo()
		return i.NumPending == 0 && i.NumAckPending == 0, fmt.Sprintf("%s: %d pending, %d unacked", name, i.NumPending, i.NumAckPending)
	}
	jstest.EventuallyState(t, wait, "the consumers of subscriber "+id+" settled", func() (bool, string) {
		events, err := env.JS.Stream(ctx, topology.StreamEvents)
		if err != nil {
			return false, err.Error()
		}
		if ok, state := idle(events, webhook.Durable(id)); !ok {
			return false, state
		}
		for i, s := range env.Buckets.TurnLogs {
			if ok, state := idle(s, outcomes.Durable(webhook.Durable(id), i)); !ok {
				return false, state
			}
		}
		approvals, err := env.JS.Stream(ctx, topology.StreamApprovals)
		if err != nil {
			return false, err.Error()
		}
		return idle(approvals, webhook.DecidedDurable(id))
	})
}

// sent is the requests to path with webhook-id id.
func sent(rcv *receiver, path, id string) []request {
	return slices.DeleteFunc(rcv.requests(path), func(q request) bool { return q.ID() != id })
}

// firstOK is the index in reqs of the first request with webhook-id id
// that was answered 2xx, -1 if none; firstTry that of the first request
// with id at all.
func firstOK(reqs []request, id string) int {
	return slices.IndexFunc(reqs, func(q request) bool { return q.ID() == id && q.Status/100 == 2 })
}

func firstTry(reqs []request, id string) int {
	return slices.IndexFunc(reqs, func(q request) bool { return q.ID() == id })
}

// body is a delivery's JSON body, its data kept as sent.
type body struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

func bodyOf(t *testing.T, q request) body {
	t.Helper()
	var b body
	if err := json.Unmarshal(q.Body, &b); err != nil {
		t.Fatalf("%s: body is not JSON: %v\n%s", q.ID(), err, q.Body)
	}
	return b
}

// ----- the tests -----

// A request kept only in its turn's log (the executor publishes no copy)
// is sent once, as its published copy would be, and is: the same
// webhook-id and the same data, byte for byte (its preview summary-only),
// signed; its timestamp is when the awaiting event was stored. The copy
// is sent by a dispatcher in a second deployment where the same request
// is only published, as an earlier version's.
func TestARequestKeptOnlyInItsLogIsSentAsItsPublishedCopyWould(t *testing.T) {
	secret := newSecret(t)
	a := loggedApproval("t-logged", 0, "cli", "s1")

	logged, published := jstest.Start(t), jstest.Start(t)
	rcv := newReceiver(t)
	startDispatcher(t, logged.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/logged"), Secret: secret, Transports: []string{"cli"}},
	}})
	startDispatcher(t, published.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/published"), Secret: secret, Transports: []string{"cli"}},
	}})

	_, stored := awaitInLog(t, logged, true, a)
	id := publishRequested(t, published.JS, a) // the turn has no log there
	want := rcv.waitFor("/published", id)[0]
	got := rcv.waitFor("/logged", id)[0]
	settled(t, logged, "ops")
	if n := len(sent(rcv, "/logged", id)); n != 1 {
		t.Fatalf("the logged request was sent %d times, want once", n)
	}

	gb, wb := bodyOf(t, got), bodyOf(t, want)
	if gb.Type != "approval.requested" || gb.Type != wb.Type {
		t.Errorf("type %q, its published copy's %q", gb.Type, wb.Type)
	}
	if !bytes.Equal(gb.Data, wb.Data) {
		t.Errorf("data differs from its published copy's:\n got %s\nwant %s", gb.Data, wb.Data)
	}
	if !gb.Timestamp.Equal(stored) {
		t.Errorf("timestamp %v, want the awaiting event's stored time %v", gb.Timestamp, stored)
	}
	if bytes.Contains(got.Body, []byte("salary")) || !bytes.Contains(gb.Data, []byte(`"redacted":true`)) {
		t.Errorf("the logged request's preview is not the summary only: %s", gb.Data)
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := wh.Verify(got.Body, got.Header); err != nil {
		t.Errorf("the reference library refuses the logged request's signature: %v", err)
	}
}

// A request both kept in its log and published is sent once, from its
// log (its timestamp is the awaiting event's). A request the log does not
// keep (an earlier version's move to awaiting, a turn with no log) is
// sent once from its published copy.
func TestEachRequestIsSentOnceWhereverItIsKept(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	startDispatcher(t, env.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}},
	}})

	both := loggedApproval("t-both", 0, "cli", "s1")
	_, stored := awaitInLog(t, env, true, both)
	publishRequested(t, env.JS, both)
	earlier := loggedApproval("t-earlier", 0, "cli", "s1")
	awaitInLog(t, env, false, earlier)
	publishRequested(t, env.JS, earlier)
	nolog := loggedApproval("t-bucketed", 0, "cli", "s1")
	publishRequested(t, env.JS, nolog)
	settled(t, env, "ops")

	for _, a := range []*schemas.ApprovalRecord{both, earlier, nolog} {
		id := topology.RequestedMsgID(a.ApprovalID)
		if got := sent(rcv, "/in", id); len(got) != 1 {
			t.Errorf("%s sent %d times, want once", id, len(got))
		} else if a == both && !bodyOf(t, got[0]).Timestamp.Equal(stored) {
			t.Errorf("%s has timestamp %v, want its awaiting event's %v: not sent from its log", id, bodyOf(t, got[0]).Timestamp, stored)
		}
	}
}

// A turn's decided event is not sent before its request when the request
// comes from the log and the log consumer lags (the receiver fails the
// request's first attempts): the decided event waits, and the outcome
// after it. Each is sent once.
func TestADecidedEventWaitsForItsLoggedRequest(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	a := loggedApproval("t-1", 0, "cli", "s1")
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

	awaitInLog(t, env, true, a)
	dec := decide(t, env, a)
	out := finishInLog(t, env, a.TurnID)
	rcv.waitFor("/in", out)
	settled(t, env, "ops")

	reqs := rcv.requests("/in")
	if got := firstIDs(reqs); !slices.Equal(got, []string{req, dec, out}) {
		t.Fatalf("webhook-ids in order of arrival = %v, want %v", got, []string{req, dec, out})
	}
	ok := firstOK(reqs, req)
	if ok < 0 || sent(rcv, "/in", req)[0].Status/100 == 2 {
		t.Fatalf("the request's first attempts did not fail as arranged: %v", reqs)
	}
	if d := firstTry(reqs, dec); d < ok {
		t.Fatalf("the decided event was tried (request %d) before its request was delivered (request %d)", d, ok)
	}
	for _, id := range []string{req, dec, out} {
		n := 0
		for _, q := range sent(rcv, "/in", id) {
			if q.Status/100 == 2 {
				n++
			}
		}
		if n != 1 {
			var all []string
			for _, q := range reqs {
				all = append(all, fmt.Sprintf("%s=%d", q.ID(), q.Status))
			}
			t.Errorf("%s delivered %d times, want once: %v", id, n, all)
		}
	}
}

// A turn's outcome kept in its log after its request does not overtake the
// request when the request's delivery fails: the log consumer then tries
// the turn's later events before it tries the request again.
func TestALoggedOutcomeDoesNotOvertakeItsRetriedRequest(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	a := loggedApproval("t-1", 0, "cli", "s1")
	req := topology.RequestedMsgID(a.ApprovalID)
	rcv.answerBy(func(q request, earlier int) int {
		if q.ID() == req && earlier < 3 {
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
	jstest.Eventually(t, wait, "the request's first attempt", func() bool { return len(sent(rcv, "/in", req)) > 0 })
	out := finishInLog(t, env, a.TurnID)
	rcv.waitFor("/in", out)
	reqs := rcv.requests("/in")
	if ok, o := firstOK(reqs, req), firstTry(reqs, out); ok < 0 || o < ok {
		t.Fatalf("the outcome was tried (request %d) before its turn's request was delivered (request %d): %v", o, ok, firstIDs(reqs))
	}
}

// A decided event waiting for its request keeps waiting across a restart
// of the dispatcher (which stops at once, not held by the wait), and
// past its bound it sends the request first itself: as long as the
// request cannot be delivered, neither is the decided event, and once it
// is, the decided event follows.
func TestADecidedEventWaitsForItsRequestAcrossARestart(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	a := loggedApproval("t-1", 0, "cli", "s1")
	req := topology.RequestedMsgID(a.ApprovalID)
	rcv.answerBy(func(q request, _ int) int {
		if q.ID() == req {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	cfg := webhook.Config{
		Subscribers: []webhook.Subscriber{{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}}},
		Retry:       webhook.Retry{Attempts: 1000, Base: 100 * time.Millisecond, Max: 300 * time.Millisecond},
		Timeout:     time.Second, // a decided event waits 3s for its request, then sends it first
	}
	first := startDispatcher(t, env.JS, cfg)
	awaitInLog(t, env, true, a)
	dec := decide(t, env, a)
	jstest.Eventually(t, wait, "the request failing", func() bool { return len(sent(rcv, "/in", req)) >= 2 })
	first.stop()

	second := startDispatcher(t, env.JS, cfg)
	// Long enough for the decided event to pass its wait (3s) and try the
	// request itself too: the log consumer alone tries it at most every
	// 300ms.
	jstest.Eventually(t, wait, "the request failing after the restart", func() bool {
		return second.deliveries(t, "ops", webhook.ResultFailed) >= 12
	})
	if n := len(sent(rcv, "/in", dec)); n != 0 {
		t.Fatalf("the decided event was sent %d times while its request could not be delivered", n)
	}
	rcv.answer(http.StatusOK)
	reqs := rcv.waitFor("/in", dec)
	if ok, d := firstOK(reqs, req), firstTry(reqs, dec); ok < 0 || d < ok {
		t.Fatalf("the decided event was tried (request %d) before its request was delivered (request %d)", d, ok)
	}
}

// Two consumers that would wait on each other do not stall the
// subscriber. Turn x ends (its outcome in the log), then turn b of the
// same partition waits for approval, b is decided, and only then is x's
// pending approval abandoned (a decided event after x's outcome). Read
// after a downtime, x's outcome waits for x's decided event on the
// events consumer, which holds b's decided event, which waits for b's
// request, which comes after x's outcome in the log. b's decided event
// stops waiting and sends b's request first: everything arrives, b's
// request before b's decided event, x's decided event before x's
// outcome.
func TestConsumersWaitingOnEachOtherDoNotStall(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	cfg := webhook.Config{
		Subscribers: []webhook.Subscriber{{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}}},
		Retry:       webhook.Retry{Attempts: 1000, Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		Timeout:     time.Second,
	}
	startDispatcher(t, env.JS, cfg).stop() // the consumers exist; nobody reads them for now

	parts := len(env.Buckets.TurnLogs)
	x := "t-x"
	b := ""
	for i := 0; b == ""; i++ {
		if c := fmt.Sprintf("t-b%d", i); topology.TurnLogPartition(c, parts) == topology.TurnLogPartition(x, parts) {
			b = c
		}
	}
	xOut := endInLog(t, env, x, "s1")
	ba := loggedApproval(b, 0, "cli", "s1")
	awaitInLog(t, env, true, ba)
	bReq := topology.RequestedMsgID(ba.ApprovalID)
	bDec := decide(t, env, ba)
	xDec := decide(t, env, loggedApproval(x, 0, "cli", "s1"))

	startDispatcher(t, env.JS, cfg)
	rcv.waitFor("/in", xOut)
	rcv.waitFor("/in", bReq)
	settled(t, env, "ops")
	reqs := rcv.requests("/in")
	for _, pair := range [][2]string{{bReq, bDec}, {xDec, xOut}} {
		if before, after := firstTry(reqs, pair[0]), firstTry(reqs, pair[1]); before < 0 || after < before {
			t.Errorf("%s (request %d) not before %s (request %d): %v", pair[0], before, pair[1], after, firstIDs(reqs))
		}
	}
}

// Requests read from the logs go only to the subscribers that ask for
// them and select them (session or transport), never to another
// transport's or session's subscriber, each request of an awaiting event
// that holds several; outcomes only to those that ask for outcomes (a
// follower made for requests alone passes its outcome events over).
func TestLoggedRequestsGoOnlyToTheirSubscribers(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	sub := func(id string, transports, sessions []string, events ...webhook.Event) webhook.Subscriber {
		return webhook.Subscriber{ID: id, URL: rcv.URL("/" + id), Secret: newSecret(t), Transports: transports, Sessions: sessions, Events: events}
	}
	subs := []webhook.Subscriber{
		sub("slack", []string{"slack"}, nil),
		sub("watched", nil, []string{"watched session"}),
		sub("slack-requests", []string{"slack"}, nil, webhook.EventApprovalRequested),
		sub("slack-outcomes", []string{"slack"}, nil, webhook.EventOutcome),
		sub("discord", []string{"discord"}, []string{"s-d"}),
	}
	startDispatcher(t, env.JS, webhook.Config{Subscribers: subs})

	slack := loggedApproval("t-slack", 0, "slack", "s-a")
	cli := loggedApproval("t-cli", 0, "cli", "watched session")
	other := loggedApproval("t-other", 0, "cli", "s-a")    // nobody's: another transport, another session
	sameSession := loggedApproval("t-sd", 0, "cli", "s-d") // discord's by its session only
	twoA, twoB := loggedApproval("t-two", 0, "slack", "watched session"), loggedApproval("t-two", 1, "slack", "watched session")
	awaitInLog(t, env, true, slack)
	awaitInLog(t, env, true, cli)
	awaitInLog(t, env, true, other)
	awaitInLog(t, env, true, sameSession)
	awaitInLog(t, env, true, twoA, twoB)
	slackOut := finishInLog(t, env, slack.TurnID)
	otherOut := finishInLog(t, env, other.TurnID)

	id := func(a *schemas.ApprovalRecord) string { return topology.RequestedMsgID(a.ApprovalID) }
	want := map[string][]string{
		"slack":          {id(slack), id(twoA), id(twoB), slackOut},
		"watched":        {id(cli), id(twoA), id(twoB)},
		"slack-requests": {id(slack), id(twoA), id(twoB)},
		"slack-outcomes": {slackOut},
		"discord":        {id(sameSession)},
	}
	for _, s := range subs {
		settled(t, env, s.ID)
	}
	for _, s := range subs {
		got := firstIDs(rcv.requests("/" + s.ID))
		slices.Sort(got)
		w := slices.Clone(want[s.ID])
		slices.Sort(w)
		if !slices.Equal(got, w) {
			t.Errorf("subscriber %s got %v, want %v", s.ID, got, w)
		}
		for _, q := range rcv.requests("/" + s.ID) {
			if q.ID() == id(other) || q.ID() == otherOut || strings.Contains(string(q.Body), `"t-other"`) {
				t.Errorf("subscriber %s got %s, another transport's and session's", s.ID, q.ID())
			}
		}
	}
}
