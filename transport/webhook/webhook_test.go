package webhook_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

// A real turn through the real pipeline: the subscriber gets the approval
// request, the decision and the outcome, in that order, each signed so
// that the Standard Webhooks reference library verifies it, with the
// event's message id as webhook-id and the event's wire keys in the body.
func TestSignedDeliveriesOfARealTurn(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{})
	rcv := newReceiver(t)
	secret := newSecret(t)
	startDispatcher(t, h.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "ops", URL: rcv.URL("/hooks"), Secret: secret, Transports: []string{"cli"}},
	}})

	turn := h.Send(h.Inbound("webhooks-e2e", "alice", pipelinetest.Call("write_file", `{"path":"hello.txt","content":"hi"}`)))
	a := h.WaitPending(schemas.ApprovalID(turn, 0))
	h.Decide(a.ApprovalID, "approve", "alice")
	if o := h.WaitOutcome(turn); o.State != schemas.TurnCompleted {
		t.Fatalf("outcome %s %s", o.State, o.Code)
	}
	reqs := rcv.waitFor("/hooks", "outcome:"+turn)

	want := []string{"requested:" + a.ApprovalID, "decided:" + a.ApprovalID, "outcome:" + turn}
	if got := firstIDs(reqs); !slices.Equal(got, want) {
		t.Fatalf("webhook-ids in order of arrival = %v, want %v", got, want)
	}
	// The approver records the decision and publishes it: it is sent
	// once, from the bucket (stamped with its revision's time).
	settled(t, h.Env, "ops")
	once(t, rcv, "/hooks", want...)
	if got, at := bodyOf(t, sent(rcv, "/hooks", want[1])[0]).Timestamp, revision(t, h.Env, a.ApprovalID).Time; !got.Equal(at) {
		t.Errorf("the decision's timestamp %v, want its revision's %v", got, at)
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	other, err := standardwebhooks.NewWebhook(newSecret(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range reqs {
		if err := wh.Verify(q.Body, q.Header); err != nil {
			t.Errorf("%s: the reference library refuses the signature: %v", q.ID(), err)
		}
		if err := wh.Verify(append(q.Body, ' '), q.Header); err == nil {
			t.Errorf("%s: a changed body still verifies", q.ID())
		}
		if err := other.Verify(q.Body, q.Header); err == nil {
			t.Errorf("%s: verifies with another secret", q.ID())
		}
		if ct := q.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", q.ID(), ct)
		}
		if ts, err := strconv.ParseInt(q.Header.Get("webhook-timestamp"), 10, 64); err != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute {
			t.Errorf("%s: webhook-timestamp %q is not the time of the attempt", q.ID(), q.Header.Get("webhook-timestamp"))
		}
	}

	type body struct {
		Type      string
		Timestamp time.Time
		Data      map[string]any
	}
	bodies := map[string]body{}
	for _, q := range reqs {
		var b body
		if err := json.Unmarshal(q.Body, &b); err != nil {
			t.Fatalf("%s: body is not JSON: %v\n%s", q.ID(), err, q.Body)
		}
		bodies[q.ID()] = b
	}
	req, dec, out := bodies[want[0]], bodies[want[1]], bodies[want[2]]
	ctx, _ := req.Data["context"].(map[string]any)
	if req.Type != "approval.requested" || req.Data["approval_id"] != a.ApprovalID || req.Data["tool"] != "write_file" ||
		req.Data["args_digest"] != a.ArgsDigest || req.Data["status"] != "pending" || ctx["transport"] != "cli" {
		t.Errorf("approval.requested body: %+v", req)
	}
	if dec.Type != "approval.decided" || dec.Data["approval_id"] != a.ApprovalID || dec.Data["status"] != "approved" {
		t.Errorf("approval.decided body: %+v", dec)
	}
	results, _ := out.Data["results"].([]any)
	if out.Type != "outcome" || out.Data["turn_id"] != turn || out.Data["state"] != "completed" || len(results) != 1 {
		t.Errorf("outcome body: %+v", out)
	}
	if req.Timestamp.IsZero() || out.Timestamp.Before(req.Timestamp) {
		t.Errorf("timestamps: requested %v, outcome %v", req.Timestamp, out.Timestamp)
	}
}

// The receiver is down while the dispatcher tries; then the dispatcher is
// down too while more events are stored; it comes back, then the receiver
// does: every event arrives, in the order it was stored.
func TestReceiverDownThenUpLosesNothingAndKeepsOrder(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	rcv.down()
	cfg := webhook.Config{
		Subscribers: []webhook.Subscriber{{ID: "late", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}}},
		Retry:       webhook.Retry{Attempts: 1000, Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		Timeout:     2 * time.Second,
	}
	first := startDispatcher(t, env.JS, cfg)
	want := []string{requestApproval(t, env.JS, approval("t-1", "cli", "s1"))}
	jstest.Eventually(t, wait, "attempts failing while the receiver is down", func() bool {
		return first.deliveries(t, "late", webhook.ResultFailed) >= 2
	})
	first.stop()

	want = append(want,
		decide(t, env, approval("t-1", "cli", "s1")),
		outcome(t, env.JS, "t-1", "cli", "s1", schemas.AudiencePersonal),
		requestApproval(t, env.JS, approval("t-2", "cli", "s1")),
	)
	second := startDispatcher(t, env.JS, cfg)
	jstest.Eventually(t, wait, "attempts failing again after the restart", func() bool {
		return second.deliveries(t, "late", webhook.ResultFailed) >= 1
	})
	rcv.up()
	reqs := rcv.waitFor("/in", want[len(want)-1])
	if got := firstIDs(reqs); !slices.Equal(got, want) {
		t.Fatalf("webhook-ids in order of arrival = %v, want %v (stream order)", got, want)
	}
	// The dispatcher counts a delivery once the receiver has answered,
	// just after the receiver saw the request.
	jstest.Eventually(t, wait, "every delivery counted", func() bool {
		return second.deliveries(t, "late", webhook.ResultDelivered) >= float64(len(want))
	})
}

// After the last attempt an event is dead-lettered for the subscriber with
// WEBHOOK_UNDELIVERABLE and its original bytes, and the subscriber's later
// events are delivered. 410 Gone is not retried. An event that does not
// decode is dead-lettered with its decoding code and never sent.
func TestUndeliverableEventsAreDeadLettered(t *testing.T) {
	cases := []struct {
		name     string
		status   int    // the receiver's answer to the first event
		garbage  bool   // the first event does not decode
		code     string // its dead letter's code
		attempts int    // requests it gets
	}{
		{"a receiver that fails every attempt", http.StatusInternalServerError, false, "WEBHOOK_UNDELIVERABLE", 3},
		{"a receiver that answers 410 Gone", http.StatusGone, false, "WEBHOOK_UNDELIVERABLE", 1},
		{"a redirect, which is never followed", http.StatusFound, false, "WEBHOOK_UNDELIVERABLE", 3},
		{"an event that does not decode", http.StatusOK, true, "MALFORMED_PAYLOAD", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := jstest.Start(t)
			rcv := newReceiver(t)
			rcv.answer(tc.status)
			d := startDispatcher(t, env.JS, webhook.Config{
				Subscribers: []webhook.Subscriber{{ID: "flaky", URL: rcv.URL("/x"), Secret: newSecret(t), Transports: []string{"cli"}}},
				Retry:       webhook.Retry{Attempts: 3, Base: 20 * time.Millisecond, Max: 50 * time.Millisecond},
			})
			var firstID string
			if tc.garbage {
				firstID = "outcome:t-bad"
				if _, err := env.JS.Publish(jstest.Ctx(t), "tollgate.event.turn.outcome.t-bad", []byte("not msgpack")); err != nil {
					t.Fatal(err)
				}
			} else {
				firstID = requestApproval(t, env.JS, approval("t-1", "cli", "s1"))
			}
			var dl []*nats.Msg
			jstest.Eventually(t, wait, "a dead letter", func() bool {
				dl = deadLetters(t, env.JS, "flaky")
				return len(dl) > 0
			})
			h := dl[0].Header
			if h.Get(runner.HeaderCode) != tc.code || h.Get(runner.HeaderStage) != "webhook.flaky" {
				t.Errorf("dead letter headers: %v", h)
			}
			if !tc.garbage {
				if s := h.Get(runner.HeaderOriginalSubject); s != "tollgate.event.approval.requested.t-1" {
					t.Errorf("dead letter of %s", s)
				}
				orig, err := schemas.Encode(approval("t-1", "cli", "s1"))
				if err != nil {
					t.Fatal(err)
				}
				var got schemas.ApprovalRecord
				if dec, err := schemas.Decode[schemas.ApprovalRecord](dl[0].Data); err != nil || len(dl[0].Data) != len(orig) {
					t.Errorf("dead letter body is not the original event (%d bytes, want %d): %v", len(dl[0].Data), len(orig), err)
				} else {
					got = *dec
				}
				if got.ApprovalID != schemas.ApprovalID("t-1", 0) {
					t.Errorf("dead letter body: %+v", got)
				}
				if h.Get(runner.HeaderDeliveries) != strconv.Itoa(tc.attempts) {
					t.Errorf("dead-lettered on delivery %q, want %d", h.Get(runner.HeaderDeliveries), tc.attempts)
				}
			}

			// The subscriber moves on: a later event is delivered. Only then
			// (it is sent after the first is settled) count the attempts.
			rcv.answer(http.StatusOK)
			next := outcome(t, env.JS, "t-2", "cli", "s2", schemas.AudiencePersonal)
			rcv.waitFor("/x", next)
			n := 0
			for _, q := range rcv.requests("/x") {
				if q.ID() == firstID {
					n++
				}
			}
			if n != tc.attempts {
				t.Errorf("the first event was sent %d times, want %d", n, tc.attempts)
			}
			if !tc.garbage {
				if got := d.deliveries(t, "flaky", webhook.ResultUndeliverable); got != 1 {
					t.Errorf("undeliverable = %v, want 1", got)
				}
				if got := d.deliveries(t, "flaky", webhook.ResultFailed); got != float64(tc.attempts-1) {
					t.Errorf("failed = %v, want %d", got, tc.attempts-1)
				}
			}
		})
	}
}

// Subscribers get exactly the events of their transports and sessions, of
// the kinds they asked for; a decided event's transport is its approval's;
// an outcome that goes nowhere goes to nobody.
func TestSubscribersGetOnlyTheirEvents(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	sub := func(id string, transports, sessions []string, events ...webhook.Event) webhook.Subscriber {
		return webhook.Subscriber{ID: id, URL: rcv.URL("/" + id), Secret: newSecret(t), Transports: transports, Sessions: sessions, Events: events}
	}
	startDispatcher(t, env.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		sub("slack", []string{"slack"}, nil),
		sub("watched", nil, []string{"watched session"}),
		sub("slack-outcomes", []string{"slack"}, nil, webhook.EventOutcome),
	}})

	slack, cli := approval("t-slack", "slack", "s-a"), approval("t-cli", "cli", "watched session")
	putApproval(t, env, slack)
	putApproval(t, env, cli)
	ids := map[string]string{
		"slack requested": requestApproval(t, env.JS, slack),
		"cli requested":   requestApproval(t, env.JS, cli),
		"slack decided":   decide(t, env, slack),
		"cli decided":     decide(t, env, cli),
		"unknown decided": publishDecided(t, env.JS, schemas.ApprovalID("t-gone", 0), "t-gone", "s-b"),
		"slack outcome":   outcome(t, env.JS, slack.TurnID, "slack", "s-a", schemas.AudiencePersonal),
		"nowhere outcome": outcome(t, env.JS, "t-nowhere", "slack", "watched session", ""),
		"cli outcome":     outcome(t, env.JS, cli.TurnID, "cli", "watched session", schemas.AudiencePersonal),
	}
	// The marker is stored without a Nats-Msg-Id, as a publisher outside
	// Tollgate might: its webhook-id is still the id the protocol gives it.
	publish(t, env.JS, topology.EventSubject(topology.SubjectTurnOutcome, "t-marker"), "", &schemas.TurnOutcome{
		TurnID: "t-marker", SessionID: "watched session", State: schemas.TurnCompleted, Audience: schemas.AudiencePersonal,
		Reply: schemas.ReplyTarget{Transport: "slack", Channel: schemas.Channel{ID: "c", Kind: schemas.ChannelDM}},
	})
	ids["marker (for all)"] = topology.OutcomeMsgID("t-marker")
	want := map[string][]string{
		"slack":          {"slack requested", "slack decided", "slack outcome", "marker (for all)"},
		"watched":        {"cli requested", "cli decided", "cli outcome", "marker (for all)"},
		"slack-outcomes": {"slack outcome", "marker (for all)"},
	}
	for id, names := range want {
		t.Run(id, func(t *testing.T) {
			// Events reach a subscriber in stream order: once the marker
			// is in, every earlier event it would get is too.
			got := firstIDs(rcv.waitFor("/"+id, ids["marker (for all)"]))
			var wantIDs []string
			for _, n := range names {
				wantIDs = append(wantIDs, ids[n])
			}
			if !slices.Equal(got, wantIDs) {
				t.Errorf("got %v, want %v (%s)", got, wantIDs, strings.Join(names, ", "))
			}
		})
	}
}

// LoadConfig reads a strict JSON file; New refuses what it refuses.
func TestLoadConfig(t *testing.T) {
	secret := newSecret(t)
	good := `{"url": "https://hooks.example.com/tollgate?k=1", "secret": "` + secret + `", "transports": ["gateway"]`
	file := func(subscriber string) string {
		return `{"timeout": "5s", "retry": {"attempts": 4, "base": "1s", "max": "1m"}, "subscribers": [{"id": "ops", ` + subscriber + `}]}`
	}
	cases := []struct {
		name, json, err string
	}{
		{"a valid file", file(good[1:] + `, "sessions": ["s 1"], "events": ["outcome"], "headers": {"Authorization": "Bearer x"}`), ""},
		{"a CR LF in the URL (header injection)", file(`"url": "http://127.0.0.1/hook\r\nX-Injected: 1", "secret": "` + secret + `", "transports": ["cli"]`), "control character U+000D"},
		{"a bare LF in the URL", file(`"url": "http://127.0.0.1/hook\nX-Injected: 1", "secret": "` + secret + `", "transports": ["cli"]`), "control character U+000A"},
		{"a NUL in the URL", file(`"url": "http://127.0.0.1/\u0000", "secret": "` + secret + `", "transports": ["cli"]`), "control character U+0000"},
		{"a space in the URL", file(`"url": "http://127.0.0.1/a b", "secret": "` + secret + `", "transports": ["cli"]`), "white space"},
		{"a CR LF in a header value (header injection)", file(good[1:] + `, "headers": {"Authorization": "x\r\nX-Evil: 1"}`), "control character U+000D"},
		{"a header name that is not a token", file(good[1:] + `, "headers": {"X Evil": "1"}`), "HTTP token"},
		{"a header the dispatcher sets", file(good[1:] + `, "headers": {"Webhook-Signature": "v1,x"}`), "set by the dispatcher"},
		{"another scheme", file(`"url": "ftp://127.0.0.1/x", "secret": "` + secret + `", "transports": ["cli"]`), "scheme must be http or https"},
		{"user information in the URL", file(`"url": "https://me:pw@127.0.0.1/x", "secret": "` + secret + `", "transports": ["cli"]`), "user information"},
		{"no host", file(`"url": "http:///x", "secret": "` + secret + `", "transports": ["cli"]`), "a host is required"},
		{"a secret without whsec_", file(`"url": "http://127.0.0.1/x", "secret": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", "transports": ["cli"]`), `want "whsec_"`},
		{"a secret that is not base64", file(`"url": "http://127.0.0.1/x", "secret": "whsec_!!!", "transports": ["cli"]`), "not standard base64"},
		{"a secret too short", file(`"url": "http://127.0.0.1/x", "secret": "whsec_c2VjcmV0", "transports": ["cli"]`), "want 24 to 64"},
		{"neither transports nor sessions", file(`"url": "http://127.0.0.1/x", "secret": "` + secret + `"`), "give transports, sessions or both"},
		{"a bad transport name", file(`"url": "http://127.0.0.1/x", "secret": "` + secret + `", "transports": ["a.b"]`), "want a transport name"},
		{"an unknown event", file(good[1:] + `, "events": ["turn.started"]`), "event \"turn.started\""},
		{"an unknown field", file(good[1:] + `, "url2": "x"`), "unknown field"},
		{"trailing data", file(good[1:]) + `{}`, "trailing data"},
		{"a bad duration", `{"timeout": "soon", "subscribers": []}`, "timeout \"soon\""},
		{"a base longer than the max", `{"retry": {"base": "2m", "max": "1m"}, "subscribers": []}`, "longer than retry.max"},
		{"a bad id", `{"subscribers": [{"id": "Ops!", ` + good[1:] + `}]}`, "subscribers[0]: id"},
		{"an id used twice", `{"subscribers": [{"id": "a", ` + good[1:] + `}, {"id": "a", ` + good[1:] + `}]}`, "id used twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := t.TempDir() + "/webhooks.json"
			if err := os.WriteFile(path, []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := webhook.LoadConfig(path)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("LoadConfig: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("LoadConfig error = %v, want one containing %q", err, tc.err)
			case tc.err != "" && strings.Contains(err.Error(), secret[6:]):
				t.Fatalf("the error shows the secret: %v", err)
			case tc.err != "":
				return
			}
			s := cfg.Subscribers[0]
			if cfg.Timeout != 5*time.Second || cfg.Retry != (webhook.Retry{Attempts: 4, Base: time.Second, Max: time.Minute}) ||
				s.ID != "ops" || s.Secret != secret || !slices.Equal(s.Sessions, []string{"s 1"}) ||
				!slices.Equal(s.Events, []webhook.Event{webhook.EventOutcome}) || s.Headers["Authorization"] != "Bearer x" {
				t.Errorf("parsed %+v", cfg)
			}
		})
	}

	t.Run("New refuses a URL with a CR LF", func(t *testing.T) {
		env := jstest.Start(t)
		_, err := webhook.New(env.JS, webhook.Config{Subscribers: []webhook.Subscriber{
			{ID: "x", URL: "http://127.0.0.1/\r\nX-Injected: 1", Secret: secret, Transports: []string{"cli"}},
		}})
		if err == nil || !strings.Contains(err.Error(), "header injection") {
			t.Fatalf("New error = %v", err)
		}
	})
}

// Run fails before starting any subscriber when the events stream is
// missing (no consumer could be created).
func TestRunFailsWithoutTheEventsStream(t *testing.T) {
	env := jstest.Start(t)
	if err := env.JS.DeleteStream(jstest.Ctx(t), topology.StreamEvents); err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t)
	d, err := webhook.New(env.JS, webhook.Config{Subscribers: []webhook.Subscriber{
		{ID: "a", URL: rcv.URL("/a"), Secret: newSecret(t), Transports: []string{"cli"}},
		{ID: "b", URL: rcv.URL("/b"), Secret: newSecret(t), Transports: []string{"cli"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(jstest.Ctx(t)) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), topology.StreamEvents) || !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("Run = %v, want an error saying the events stream is missing", err)
		}
	case <-jstest.After(wait):
		t.Fatal("Run did not return")
	}
}

// A turn's outcome kept in its log (the write that ended the turn) is
// sent after the turn's approval events, even while those are being
// retried (it is not even attempted before), and once: its published copy
// is not sent again. An outcome kept only in its log is sent too.
func TestALoggedOutcomeWaitsForItsTurnsEventsAndComesOnce(t *testing.T) {
	env := jstest.Start(t)
	rcv := newReceiver(t)
	rcv.answer(http.StatusInternalServerError)
	d := startDispatcher(t, env.JS, webhook.Config{
		Subscribers: []webhook.Subscriber{{ID: "ops", URL: rcv.URL("/in"), Secret: newSecret(t), Sessions: []string{"s1"}}},
		Retry:       webhook.Retry{Attempts: 1000, Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		Timeout:     2 * time.Second,
	})
	req := requestApproval(t, env.JS, approval("t-1", "cli", "s1"))
	dec := decide(t, env, approval("t-1", "cli", "s1"))
	out := endInLog(t, env, "t-1", "s1")
	outcome(t, env.JS, "t-1", "cli", "s1", schemas.AudiencePersonal) // its published copy
	alone := endInLog(t, env, "t-2", "s1")                           // kept in its log alone
	jstest.Eventually(t, wait, "the approval requested event retried", func() bool {
		return d.deliveries(t, "ops", webhook.ResultFailed) >= 3
	})
	if slices.ContainsFunc(rcv.requests("/in"), func(q request) bool { return q.ID() == out }) {
		t.Fatalf("the outcome of t-1 was sent before its approval events were delivered: %v", firstIDs(rcv.requests("/in")))
	}
	rcv.answer(http.StatusOK)
	rcv.waitFor("/in", out)
	rcv.waitFor("/in", alone)
	// Later facts, then the absences: an approval event after t-1's
	// published outcome, and an outcome kept in the log of t-1's
	// partition after t-1's (each partition's outcomes are sent in order).
	marker := requestApproval(t, env.JS, approval("t-3", "cli", "s1"))
	parts := len(env.Buckets.TurnLogs)
	after := ""
	for i := 0; after == ""; i++ {
		if c := "t-m" + strconv.Itoa(i); topology.TurnLogPartition(c, parts) == topology.TurnLogPartition("t-1", parts) {
			after = endInLog(t, env, c, "s1")
		}
	}
	rcv.waitFor("/in", marker)
	reqs := rcv.waitFor("/in", after)
	var order []string // t-1's: the order is per turn
	for _, id := range firstIDs(reqs) {
		if id == req || id == dec || id == out {
			order = append(order, id)
		}
	}
	if want := []string{req, dec, out}; !slices.Equal(order, want) {
		t.Fatalf("t-1's webhook-ids in order of arrival = %v, want %v (all: %v)", order, want, firstIDs(reqs))
	}
	// t-1's outcome was first attempted once the receiver answered: one
	// request, from the log (its published copy dropped). t-2's may have
	// been attempted while the receiver failed.
	n := 0
	for _, q := range reqs {
		if q.ID() == out {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%s sent %d times, want once", out, n)
	}
}

// endInLog creates turn's batch in its log and ends it with its outcome
// (replied to cli, personal), as the stages do: one call, which needed
// approval 0 and ran; it returns the outcome's webhook-id.
func endInLog(t *testing.T, env *jstest.Env, turn, session string) string {
	t.Helper()
	ctx := jstest.Ctx(t)
	b, err := topology.OpenBuckets(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(b)
	now := time.Now().UTC()
	args := `{"path":"a.txt"}`
	rec := &schemas.BatchRecord{TurnID: turn, SessionID: session, State: schemas.BatchRunning,
		Calls:     []schemas.ToolCall{{CallID: schemas.CallID(turn, 0), Index: 0, Tool: "write_file", Args: args, ArgsDigest: schemas.ArgsDigest(args)}},
		Approvals: []string{schemas.ApprovalID(turn, 0)}, Results: []*schemas.ToolResult{nil}, CreatedAt: now, UpdatedAt: now}
	rev, err := st.Batches.Log.Create(ctx, turn, rec)
	if err != nil {
		t.Fatal(err)
	}
	rec.State = schemas.BatchCompleted
	result := resultOf(turn, 0)
	rec.Results[0] = &result
	rec.Outcome = &schemas.TurnOutcome{V: schemas.TurnOutcomeVersion, TurnID: turn, SessionID: session, State: schemas.TurnCompleted,
		Results: []schemas.ToolResult{result}, Audience: schemas.AudiencePersonal, FinishedAt: now,
		Reply: schemas.ReplyTarget{Transport: "cli", Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}}}
	if _, err := st.Batches.Log.Update(ctx, turn, rec, rev); err != nil {
		t.Fatal(err)
	}
	return topology.OutcomeMsgID(turn)
}
