package webhook_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

const wait = pipelinetest.Wait

// newSecret returns a fresh Standard Webhooks secret.
func newSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// request is one request a receiver got, and the status it answered.
type request struct {
	Path   string
	Header http.Header
	Body   []byte
	Status int
}

// ID is the request's webhook-id.
func (r request) ID() string { return r.Header.Get("webhook-id") }

// Type is the body's event type.
func (r request) Type() string {
	var b struct{ Type string }
	_ = json.Unmarshal(r.Body, &b)
	return b.Type
}

// receiver is a real HTTP server on 127.0.0.1 that records every request
// and answers with status(path), or by(request, earlier) when set. It can
// go down (its port closed) and come up again on the same port.
type receiver struct {
	t    *testing.T
	addr string

	mu     sync.Mutex
	srv    *http.Server
	reqs   []request
	status func(path string) int
	by     func(q request, earlier int) int
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{t: t, status: func(string) int { return http.StatusOK }}
	r.up()
	t.Cleanup(r.down)
	return r
}

// URL is the receiver's address with path.
func (r *receiver) URL(path string) string { return "http://" + r.addr + path }

// up starts serving (on the same port as before, if it was up before).
func (r *receiver) up() {
	r.t.Helper()
	addr := r.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatalf("receiver: listen %s: %v", addr, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	r.mu.Lock()
	r.addr, r.srv = ln.Addr().String(), srv
	r.mu.Unlock()
}

// down closes the port: connections are refused until up.
func (r *receiver) down() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	q := request{Path: req.URL.Path, Header: req.Header.Clone(), Body: body}
	r.mu.Lock()
	if r.by != nil {
		earlier := 0
		for _, p := range r.reqs {
			if p.Path == q.Path && p.ID() == q.ID() {
				earlier++
			}
		}
		q.Status = r.by(q, earlier)
	} else {
		q.Status = r.status(q.Path)
	}
	r.reqs = append(r.reqs, q)
	r.mu.Unlock()
	w.WriteHeader(q.Status)
}

// answerBy makes the receiver answer f(q, earlier) from now on: earlier is
// how many requests to q's path with q's webhook-id it got before.
func (r *receiver) answerBy(f func(q request, earlier int) int) {
	r.mu.Lock()
	r.by = f
	r.mu.Unlock()
}

// answer makes the receiver answer status to every request from now on.
func (r *receiver) answer(status int) {
	r.mu.Lock()
	r.status, r.by = func(string) int { return status }, nil
	r.mu.Unlock()
}

// requests returns the requests to path so far ("" for all).
func (r *receiver) requests(path string) []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []request
	for _, q := range r.reqs {
		if path == "" || q.Path == path {
			out = append(out, q)
		}
	}
	return out
}

// waitFor waits until a request to path carries webhook-id id and
// returns the requests to path up to then.
func (r *receiver) waitFor(path, id string) []request {
	r.t.Helper()
	var got []request
	jstest.Eventually(r.t, wait, "a request to "+path+" with webhook-id "+id, func() bool {
		got = r.requests(path)
		return slices.ContainsFunc(got, func(q request) bool { return q.ID() == id })
	})
	return got
}

// firstIDs is the webhook-ids of reqs in order of first appearance.
func firstIDs(reqs []request) []string {
	var ids []string
	for _, q := range reqs {
		if !slices.Contains(ids, q.ID()) {
			ids = append(ids, q.ID())
		}
	}
	return ids
}

// dispatcher is a running Dispatcher.
type dispatcher struct {
	reg  *prometheus.Registry
	stop func()
}

// startDispatcher runs a dispatcher for cfg on js until the test ends (or
// stop), and returns once every subscriber's consumer exists, so that
// events published from then on are delivered.
func startDispatcher(t *testing.T, js jetstream.JetStream, cfg webhook.Config) *dispatcher {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer, cfg.Logger = reg, pipelinetest.Logger()
	d, err := webhook.New(js, cfg)
	if err != nil {
		t.Fatalf("webhook.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-jstest.After(wait):
				t.Errorf("Run did not return within %v of its context's end", wait)
			}
		})
	}
	t.Cleanup(stop)
	jstest.Eventually(t, wait, "the subscribers' consumers consume", func() bool { return d.Ready() == nil })
	for _, s := range cfg.Subscribers {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_, err := js.Consumer(ctx, topology.StreamEvents, webhook.Durable(s.ID))
		cancel()
		if err != nil {
			t.Fatalf("ready, but no consumer of subscriber %s: %v", s.ID, err)
		}
	}
	return &dispatcher{reg: reg, stop: stop}
}

// deliveries is tollgate_webhook_deliveries_total{subscriber, result}.
func (d *dispatcher) deliveries(t *testing.T, subscriber, result string) float64 {
	t.Helper()
	mfs, err := d.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_webhook_deliveries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["subscriber"] == subscriber && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// ----- events, as the stages publish them -----

// publish stores r on subject with message id msgID, as a stage does.
func publish(t *testing.T, js jetstream.JetStream, subject, msgID string, r schemas.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := bus.Publish(ctx, js, subject, msgID, r); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// approval is a pending approval of call 0 of turn on transport in session.
func approval(turn, transport, session string) *schemas.ApprovalRecord {
	return &schemas.ApprovalRecord{
		ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: session, CallID: schemas.CallID(turn, 0),
		Context: &schemas.TurnContext{
			SessionID: session, TurnID: turn, Transport: transport,
			Requester: schemas.Requester{Principal: transport + ":alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
			Channel:   schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}, Audience: schemas.AudiencePersonal,
			TrustBoundary: "external", Interactive: true,
		},
		Tool: "write_file", Args: `{"path":"a.txt"}`, ArgsDigest: "sha256:00", PolicyVersion: "test",
		Options: []string{"approve", "deny"}, Status: schemas.ApprovalPending, RequestedAt: time.Now().UTC(),
	}
}

// requestApproval publishes a's approval-requested event and returns its id.
func requestApproval(t *testing.T, js jetstream.JetStream, a *schemas.ApprovalRecord) string {
	t.Helper()
	id := topology.RequestedMsgID(a.ApprovalID)
	publish(t, js, topology.EventSubject(topology.SubjectApprovalRequested, a.TurnID), id, a)
	return id
}

// decide approves a as the approver does today, and returns the decided
// event's webhook-id: it records the decision (a's record, created
// pending first if the bucket does not hold it, updated to approved by
// compare-and-set) and then publishes its decided event.
func decide(t *testing.T, env *jstest.Env, a *schemas.ApprovalRecord) string {
	t.Helper()
	rec := record(t, env, a)
	publish(t, env.JS, topology.EventSubject(topology.SubjectApprovalDecided, rec.TurnID), topology.DecidedMsgID(rec.ApprovalID), schemas.DecidedOf(rec))
	return topology.DecidedMsgID(rec.ApprovalID)
}

// record approves a in the approvals bucket as the approver does (a
// compare-and-set of the pending record, created first if the bucket does
// not hold it), publishing nothing, and returns the decided record.
func record(t *testing.T, env *jstest.Env, a *schemas.ApprovalRecord) *schemas.ApprovalRecord {
	t.Helper()
	ctx := jstest.Ctx(t)
	approvals := store.New(env.Buckets).Approvals
	cur, rev, err := approvals.Get(ctx, a.ApprovalID)
	if errors.Is(err, store.ErrNotFound) {
		cur = stored(a)
		rev, err = approvals.Create(ctx, a.ApprovalID, cur)
	}
	if err != nil {
		t.Fatal(err)
	}
	next := *cur
	now := time.Now().UTC()
	next.Status = schemas.ApprovalApproved
	next.Decision = &schemas.DecisionInfo{DecisionID: "d-" + a.ApprovalID, Principal: "cli:bob", Option: schemas.OptionApprove, DecidedAt: now}
	if _, err := approvals.Update(ctx, a.ApprovalID, &next, rev); err != nil {
		t.Fatal(err)
	}
	return &next
}

// stored is a as the executor stores it: versioned, its digest its
// arguments'.
func stored(a *schemas.ApprovalRecord) *schemas.ApprovalRecord {
	c := *a
	c.V = schemas.ApprovalVersion
	c.ArgsDigest = schemas.ArgsDigest(c.Args)
	return &c
}

// publishDecided publishes a decided event of approval id of turn in
// session that no record in the bucket stands for (an earlier version's,
// or one of an approval past retention).
func publishDecided(t *testing.T, js jetstream.JetStream, approvalID, turn, session string) string {
	t.Helper()
	id := topology.DecidedMsgID(approvalID)
	publish(t, js, topology.EventSubject(topology.SubjectApprovalDecided, turn), id, &schemas.DecidedEvent{
		ApprovalID: approvalID, TurnID: turn, SessionID: session, Status: schemas.ApprovalApproved,
		Decision: &schemas.DecisionInfo{Principal: "cli:bob", Option: "approve", DecidedAt: time.Now().UTC()}, At: time.Now().UTC(),
	})
	return id
}

// outcome publishes turn's outcome, replied to transport with audience
// ("" for an outcome that goes nowhere), and returns its id. Its one
// result is call 0's, which needed approval 0, as a real outcome names
// every call.
func outcome(t *testing.T, js jetstream.JetStream, turn, transport, session string, audience schemas.Audience) string {
	t.Helper()
	o := &schemas.TurnOutcome{TurnID: turn, SessionID: session, State: schemas.TurnCompleted, Audience: audience, FinishedAt: time.Now().UTC(),
		Results: []schemas.ToolResult{resultOf(turn, 0)}}
	if audience != "" {
		o.Reply = schemas.ReplyTarget{Transport: transport, Channel: schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}}
	}
	id := topology.OutcomeMsgID(turn)
	publish(t, js, topology.EventSubject(topology.SubjectTurnOutcome, turn), id, o)
	return id
}

// resultOf is the result of call i of turn, which ran once its approval
// was given.
func resultOf(turn string, i int) schemas.ToolResult {
	return schemas.ToolResult{CallID: schemas.CallID(turn, i), Tool: "write_file", Status: schemas.ResultOK, Output: "ok",
		ApprovalID: schemas.ApprovalID(turn, i), FinishedAt: time.Now().UTC()}
}

// putApproval stores a in KV tollgate_approvals, as the executor does.
func putApproval(t *testing.T, env *jstest.Env, a *schemas.ApprovalRecord) {
	t.Helper()
	b, err := schemas.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := env.Buckets.Approvals.Put(ctx, a.ApprovalID, b); err != nil {
		t.Fatal(err)
	}
}

// deadLetters returns the dead letters of subscriber id.
func deadLetters(t *testing.T, js jetstream.JetStream, id string) []*nats.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, topology.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	subject := topology.DLQSubject(webhook.Component(id))
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject == subject {
			out = append(out, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		}
	}
	return out
}
