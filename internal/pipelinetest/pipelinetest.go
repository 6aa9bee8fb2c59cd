// Package pipelinetest runs Tollgate's four stages in-process against a real
// embedded nats-server (jetstream/jstest) for integration tests, and offers
// helpers to drive them like a transport and a decider would and to observe
// what they stored: KV records, events, dead letters and metrics.
//
// Every wait polls with a deadline; nothing sleeps and hopes. To show that
// something did not happen, wait first for a later fact that proves the
// stage finished (a terminal outcome, a rejection, or the consumer's ack
// floor passing a message with WaitConsumed), then assert the absence.
package pipelinetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/batch"
	"github.com/tollgate-dev/tollgate/pipeline/executor"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/redriver"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// Wait is how long a helper polls before failing the test. Generous for a
// loaded CI machine under -race; a passing test returns as soon as the
// condition holds.
const Wait = 20 * time.Second

// Stage names, as accepted in Options.Stages.
const (
	Ingest   = tollgate.StageIngest
	Executor = tollgate.StageExecutor
	Approver = tollgate.StageApprover
	Redriver = tollgate.StageRedriver
)

// AllStages in pipeline order.
var AllStages = tollgate.AllStages()

// Options configures Start.
type Options struct {
	// Policy is the policy JSON; "" is policy.DefaultJSON.
	Policy string
	// Stages to run; nil runs all four. Stages not run are still
	// constructed, so their Handle/Apply/Redrive methods can be called
	// directly.
	Stages []string
	// Tools are registered next to the built-in echo and write_file.
	Tools []tools.Tool
	// Providers supply tools from outside the process (tollgate.Config.
	// Providers); a provider that is a tools.Service runs with the stages.
	Providers []tools.Provider
	// ClaimLease and ToolTimeout for the batch engine (default: the
	// engine's defaults; a ClaimLease below a minute needs a ToolTimeout).
	ClaimLease  time.Duration
	ToolTimeout time.Duration
	// Env reuses a running server (e.g. to restart stages); nil starts one.
	Env *jstest.Env
	// SweepInterval and SweepAfter tune the redriver's recovery sweep
	// (default: the redriver package's defaults).
	SweepInterval, SweepAfter time.Duration
	// OrderWait is the executor's session-order wait (default
	// executor.DefaultOrderWait).
	OrderWait time.Duration
	// PreviewDeadline is the executor's preview deadline (default
	// tools.DefaultPreviewDeadline).
	PreviewDeadline time.Duration
	// Wait is how long the helpers of this harness poll before failing the
	// test (default Wait): longer for a three-node cluster whose elections
	// a loaded machine slows down.
	Wait time.Duration
	// Planner, if set, builds the planner stage (tollgate.Config.Planner);
	// name tollgate.StagePlanner in Stages to run it.
	Planner *planner.Options
	// Keys seal and verify TurnContexts; nil is Keys(t), a fresh ring.
	// Pass the previous pipeline's ring when restarting on the same server.
	Keys *seal.KeyRing
	// Retention, when set, is tollgate.Config.Retention, and the streams'
	// max age (which it may not be shorter than) is cut to it.
	Retention time.Duration
	// NoGroupCommit runs the stages with the group committer off
	// (tollgate.Config.NoGroupCommit), as versions before it wrote.
	NoGroupCommit bool
}

// Keys returns the test binary's key ring: one random key, "k1", made once
// per process, so that every harness and engine of a test (and a restarted
// pipeline) verify each other's seals. A test of key handling builds its
// own ring with package seal.
// t may be nil (in a fixture built outside a test function).
func Keys(t testing.TB) *seal.KeyRing {
	ringOnce.Do(func() { ring, ringErr = seal.NewFile("k1").Ring() })
	if ringErr != nil {
		if t == nil {
			panic(ringErr)
		}
		t.Fatalf("pipelinetest: keys: %v", ringErr)
	}
	return ring
}

var (
	ringOnce sync.Once
	ring     *seal.KeyRing
	ringErr  error
)

// H is a running pipeline as seen from one test. Use For in a subtest so
// that helpers fail the subtest, not its parent.
type H struct {
	T testing.TB
	*Pipeline
}

// Pipeline is the state shared by every H of one Start.
type Pipeline struct {
	Env      *jstest.Env
	JS       jetstream.JetStream
	Store    *store.Store
	Policy   *policy.Policy
	Keys     *seal.KeyRing
	Sandbox  string
	Registry *prometheus.Registry
	Tools    *tools.Catalog

	// What tollgate.New built: the stages, and the one batch engine of
	// the executor and the redriver.
	Ingest   *ingest.Ingest
	Executor *executor.Executor
	Approver *approver.Approver
	Redriver *redriver.Redriver
	Engine   *batch.Engine
	Planner  *planner.Planner // nil without Options.Planner

	owner   testing.TB
	wait    time.Duration // Options.Wait, or Wait
	cancel  context.CancelFunc
	done    chan error
	stopped atomic.Bool
}

// seq numbers NextID process-wide, so that pipelines sharing a server
// (restarts) never reuse a message or decision id.
var seq atomic.Int64

// For returns the harness reporting to t (a subtest).
func (h *H) For(t testing.TB) *H { return &H{T: t, Pipeline: h.Pipeline} }

// Logger discards logs unless TOLLGATE_TEST_LOG is set (then: stderr, debug).
func Logger() *slog.Logger {
	if os.Getenv("TOLLGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Start builds the pipeline with tollgate.New (every stage constructed,
// with instance "test", on a fresh or the given embedded server), runs the
// selected stages until the test ends, and returns the harness.
func Start(t testing.TB, o Options) *H {
	t.Helper()
	env := o.Env
	if env == nil {
		env = jstest.Start(t)
	}
	pj := o.Policy
	if pj == "" {
		pj = policy.DefaultJSON
	}
	pol, err := policy.Parse([]byte(pj))
	if err != nil {
		t.Fatalf("pipelinetest: policy: %v", err)
	}
	sandbox := filepath.Join(t.TempDir(), "sandbox")
	builtins, err := tools.Builtins(sandbox)
	if err != nil {
		t.Fatalf("pipelinetest: %v", err)
	}
	keys := o.Keys
	if keys == nil {
		keys = Keys(t)
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(o.Wait, Wait))
	defer cancel()
	topo := env.Topology
	if o.Retention > 0 {
		topo.MaxAge, topo.DuplicateWindow = o.Retention, min(topo.DuplicateWindow, o.Retention)
	}
	p, err := tollgate.New(ctx, tollgate.Config{
		JS: env.JS, Policy: pol, Keys: keys, Tools: append(builtins, o.Tools...), Providers: o.Providers, Logger: Logger(), Registerer: reg,
		Instance: "test", Topology: topo, Retention: o.Retention,
		ClaimLease: o.ClaimLease, ToolTimeout: o.ToolTimeout, OrderWait: o.OrderWait,
		PreviewDeadline: o.PreviewDeadline,
		SweepInterval:   o.SweepInterval, SweepAfter: o.SweepAfter, Planner: o.Planner, NoGroupCommit: o.NoGroupCommit,
	})
	if err != nil {
		t.Fatalf("pipelinetest: %v", err)
	}
	stages := o.Stages
	if stages == nil {
		stages = AllStages
	}
	for _, s := range stages {
		if !slices.Contains(AllStages, s) && s != tollgate.StagePlanner {
			t.Fatalf("pipelinetest: unknown stage %q", s)
		}
	}
	runCtx, stop := context.WithCancel(context.Background())
	h := &H{T: t, Pipeline: &Pipeline{
		Env: env, JS: env.JS, Store: p.Store, Policy: pol, Keys: keys, Sandbox: sandbox, Registry: reg, Tools: p.Tools,
		Ingest: p.Ingest, Executor: p.Executor, Approver: p.Approver, Redriver: p.Redriver, Engine: p.Engine, Planner: p.Planner,
		owner: t, wait: cmp.Or(o.Wait, Wait), cancel: stop, done: make(chan error, 1),
	}}
	t.Cleanup(h.Stop)
	go func() { h.done <- p.RunStages(runCtx, stages...) }()
	return h
}

// Stop stops the running stages and waits for them to drain. It is called
// by t.Cleanup and may be called earlier (e.g. before restarting stages).
func (h *Pipeline) Stop() {
	if h.stopped.Swap(true) {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.owner.Errorf("pipelinetest: %v", err)
		}
	case <-time.After(45 * time.Second):
		h.owner.Errorf("pipelinetest: stages did not stop within 45s")
	}
}

// Ctx is a context for one helper call.
func (h *Pipeline) Ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// ----- driving the pipeline -----

// Call is a proposed tool call.
func Call(tool, args string) schemas.ProposedCall {
	return schemas.ProposedCall{Tool: tool, Args: args}
}

// NextID returns a fresh id with prefix, unique within the process.
func (h *Pipeline) NextID(prefix string) string {
	return prefix + "-" + strconv.FormatInt(seq.Add(1), 10)
}

// Inbound builds a valid inbound message from a verified user on transport
// "cli" in a DM, with a fresh message id.
func (h *Pipeline) Inbound(session, sender string, calls ...schemas.ProposedCall) *schemas.InboundMessage {
	return &schemas.InboundMessage{
		Transport: "cli", MessageID: h.NextID("m"), SessionID: session,
		Sender:  schemas.Sender{ID: sender, Display: sender, Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "dm-" + sender, Kind: schemas.ChannelDM},
		Text:    "please", Calls: calls, SentAt: time.Now().UTC(),
	}
}

// Send publishes m on its transport's inbound subject as a transport would
// (message id "transport:message_id") and returns the turn id it becomes.
func (h *H) Send(m *schemas.InboundMessage) string {
	h.T.Helper()
	h.Publish(topology.InboundSubject(m.Transport, m.SessionID), topology.InboundMsgID(m.Transport, m.MessageID), m)
	return schemas.TurnID(m.Transport, m.MessageID)
}

// Publish encodes r and publishes it with msgID ("" for none), returning its
// stream sequence.
func (h *H) Publish(subject, msgID string, r schemas.Record) uint64 {
	h.T.Helper()
	data, err := schemas.Encode(r)
	if err != nil {
		h.T.Fatalf("pipelinetest: encode %T: %v", r, err)
	}
	return h.PublishRaw(subject, msgID, data, nil)
}

// PublishRaw publishes data as is and returns its stream sequence.
func (h *H) PublishRaw(subject, msgID string, data []byte, hdr nats.Header) uint64 {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	var opts []jetstream.PublishOpt
	if msgID != "" {
		opts = append(opts, jetstream.WithMsgID(msgID))
	}
	ack, err := h.JS.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data, Header: hdr}, opts...)
	if err != nil {
		h.T.Fatalf("pipelinetest: publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// Decision builds a decision by sender on transport (a verified user).
func (h *Pipeline) Decision(approvalID, option, transport, sender string) *schemas.Decision {
	return &schemas.Decision{
		DecisionID: h.NextID("d"), ApprovalID: approvalID, Transport: transport,
		Decider: schemas.Sender{ID: sender, Kind: schemas.SenderUser, Verified: true},
		Option:  option, SentAt: time.Now().UTC(),
	}
}

// Submit publishes d on its approval's decision subject (message id: the
// decision id) and returns its stream sequence.
func (h *H) Submit(d *schemas.Decision) uint64 {
	h.T.Helper()
	return h.Publish(topology.DecisionSubject(d.Transport, d.ApprovalID), topology.DecisionMsgID(d.DecisionID), d)
}

// Decide submits option on approvalID as sender on transport "cli" and
// returns the decision.
func (h *H) Decide(approvalID, option, sender string) *schemas.Decision {
	h.T.Helper()
	d := h.Decision(approvalID, option, "cli", sender)
	h.Submit(d)
	return d
}

// Accept returns the accepted turn that ingest would publish for m under
// the harness's policy, its context sealed with the harness's keys, for
// tests that play the ingest stage themselves.
func (h *H) Accept(m *schemas.InboundMessage) *schemas.AcceptedTurn {
	h.T.Helper()
	at, err := ingest.Accept(m, h.Policy, schemas.Provenance{StreamSeq: 1, ReceivedAt: time.Now().UTC(), IngestedBy: "test"})
	if err != nil {
		h.T.Fatalf("pipelinetest: accept: %v", err)
	}
	if err := h.Keys.Seal(at.Context); err != nil {
		h.T.Fatalf("pipelinetest: seal: %v", err)
	}
	return at
}

// ----- KV -----

// MutateBatch edits the batch record of turnID in KV behind the pipeline's
// back (compare-and-set), as an attacker or a stray operator edit would.
func (h *H) MutateBatch(turnID string, fn func(*schemas.BatchRecord)) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := h.Store.Batches.Mutate(ctx, turnID, func(b *schemas.BatchRecord) error { fn(b); return nil }); err != nil {
		h.T.Fatalf("pipelinetest: tamper batch %s: %v", turnID, err)
	}
}

// MutateApproval edits approval record id in KV like MutateBatch.
func (h *H) MutateApproval(id string, fn func(*schemas.ApprovalRecord)) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := h.Store.Approvals.Mutate(ctx, id, func(a *schemas.ApprovalRecord) error { fn(a); return nil }); err != nil {
		h.T.Fatalf("pipelinetest: tamper approval %s: %v", id, err)
	}
}

// MutateSession edits the session record of sessionID of transport "cli"
// (Inbound's) in KV like MutateBatch (e.g. to play a worker that died
// between two steps).
func (h *H) MutateSession(sessionID string, fn func(*schemas.SessionRecord)) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, _, err := h.Store.Sessions.Mutate(ctx, schemas.SessionKey("cli", sessionID), func(s *schemas.SessionRecord) error { fn(s); return nil }); err != nil {
		h.T.Fatalf("pipelinetest: edit session %s: %v", sessionID, err)
	}
}

// Batch returns the batch record of turnID, or nil if there is none.
func (h *H) Batch(turnID string) *schemas.BatchRecord {
	h.T.Helper()
	return getOrNil(h, h.Store.Batches, turnID)
}

// Approval returns the approval record id, or nil if there is none.
func (h *H) Approval(id string) *schemas.ApprovalRecord {
	h.T.Helper()
	return getOrNil(h, h.Store.Approvals, id)
}

// Session returns the session record of sessionID of transport "cli"
// (Inbound's), or nil.
func (h *H) Session(sessionID string) *schemas.SessionRecord {
	h.T.Helper()
	return h.SessionOn("cli", sessionID)
}

// SessionOn returns the session record of sessionID of transport, or nil.
func (h *H) SessionOn(transport, sessionID string) *schemas.SessionRecord {
	h.T.Helper()
	return getOrNil(h, h.Store.Sessions, schemas.SessionKey(transport, sessionID))
}

// getOrNil reads key from b: nil if absent, a test failure on any other error.
func getOrNil[T any, P schemas.Ptr[T]](h *H, b store.Bucket[T, P], key string) *T {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	v, _, err := b.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		h.T.Fatalf("pipelinetest: %v", err)
	}
	return v
}

// WaitBatch polls the batch of turnID until cond holds and returns it.
func (h *H) WaitBatch(turnID, what string, cond func(*schemas.BatchRecord) bool) *schemas.BatchRecord {
	h.T.Helper()
	var b *schemas.BatchRecord
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("batch %s: %s", turnID, what), func() bool {
		b = h.Batch(turnID)
		return b != nil && cond(b)
	})
	return b
}

// WaitState waits for the batch of turnID to be in state s.
func (h *H) WaitState(turnID string, s schemas.BatchState) *schemas.BatchRecord {
	h.T.Helper()
	return h.WaitBatch(turnID, "state "+string(s), func(b *schemas.BatchRecord) bool { return b.State == s })
}

// WaitTerminal waits until the batch of turnID is terminal and its outcome
// event is stored, and returns the batch and the (single) outcome.
func (h *H) WaitTerminal(turnID string) (*schemas.BatchRecord, *schemas.TurnOutcome) {
	h.T.Helper()
	b := h.WaitBatch(turnID, "terminal", func(b *schemas.BatchRecord) bool { return b.State.Terminal() })
	o := h.WaitOutcome(turnID)
	return b, o
}

// WaitApproval polls approval id until cond holds.
func (h *H) WaitApproval(id, what string, cond func(*schemas.ApprovalRecord) bool) *schemas.ApprovalRecord {
	h.T.Helper()
	var a *schemas.ApprovalRecord
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("approval %s: %s", id, what), func() bool {
		a = h.Approval(id)
		return a != nil && cond(a)
	})
	return a
}

// WaitPending waits for approval id to exist in status pending and for the
// batch of its turn to be awaiting.
func (h *H) WaitPending(id string) *schemas.ApprovalRecord {
	h.T.Helper()
	a := h.WaitApproval(id, "pending", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalPending })
	h.WaitState(a.TurnID, schemas.BatchAwaiting)
	return a
}

// PutRaw writes raw bytes at key in kv, bypassing encoding (tampering).
func (h *H) PutRaw(kv jetstream.KeyValue, key string, data []byte) {
	h.T.Helper()
	ctx, cancel := h.Ctx()
	defer cancel()
	if _, err := kv.Put(ctx, key, data); err != nil {
		h.T.Fatalf("pipelinetest: put %s/%s: %v", kv.Bucket(), key, err)
	}
}

// ----- streams -----

// Stored is one message as stored in a stream.
type Stored struct {
	Subject string
	Seq     uint64
	Data    []byte
	Header  nats.Header
}

// Messages returns every message stored in stream on subjects matching
// filter, in stream order. A read that fails part-way (on a cluster, a
// consumer placed or led by a node that has just gone away answers "no
// responders" until the cluster notices) is started again, for up to the harness's wait.
func (h *H) Messages(stream, filter string) []Stored {
	h.T.Helper()
	var out []Stored
	var err error
	deadline := time.Now().Add(h.wait)
	for {
		if out, err = h.readAll(stream, filter); err == nil {
			return out
		}
		if time.Now().After(deadline) {
			h.T.Fatalf("pipelinetest: read %s %s: %v", stream, filter, err)
		}
		h.T.Logf("pipelinetest: read %s %s: %v; reading again", stream, filter, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// readAll reads every message stored in stream on subjects matching filter
// through an ephemeral consumer.
func (h *H) readAll(stream, filter string) ([]Stored, error) {
	ctx, cancel := h.Ctx()
	defer cancel()
	cons, err := h.JS.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: 30 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	defer func() { _ = h.JS.DeleteConsumer(context.WithoutCancel(ctx), stream, cons.CachedInfo().Name) }()
	n := int(cons.CachedInfo().NumPending)
	out := make([]Stored, 0, n)
	for len(out) < n {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			meta, err := m.Metadata()
			if err != nil {
				return nil, fmt.Errorf("metadata: %w", err)
			}
			out = append(out, Stored{Subject: m.Subject(), Seq: meta.Sequence.Stream, Data: m.Data(), Header: m.Headers()})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		if got == 0 {
			return nil, fmt.Errorf("fetched %d of %d messages", len(out), n)
		}
	}
	return out, nil
}

// Events returns the events stored on subjects matching filter.
func (h *H) Events(filter string) []Stored {
	h.T.Helper()
	return h.Messages(topology.StreamEvents, filter)
}

// DecodeAll decodes every message as a T, failing the test on any error.
func DecodeAll[T any, P schemas.Ptr[T]](t testing.TB, msgs []Stored) []*T {
	t.Helper()
	out := make([]*T, 0, len(msgs))
	for _, m := range msgs {
		v, err := schemas.Decode[T, P](m.Data)
		if err != nil {
			t.Fatalf("pipelinetest: decode %s #%d: %v", m.Subject, m.Seq, err)
		}
		out = append(out, v)
	}
	return out
}

// Outcomes returns the stored turn outcomes of turnID.
func (h *H) Outcomes(turnID string) []*schemas.TurnOutcome {
	h.T.Helper()
	return DecodeAll[schemas.TurnOutcome](h.T, h.Events(topology.EventSubject(topology.SubjectTurnOutcome, turnID)))
}

// WaitOutcome waits for the outcome event of turnID and returns it; it fails
// if more than one is stored.
func (h *H) WaitOutcome(turnID string) *schemas.TurnOutcome {
	h.T.Helper()
	var outs []*schemas.TurnOutcome
	jstest.Eventually(h.T, h.wait, "outcome of "+turnID, func() bool {
		outs = h.Outcomes(turnID)
		return len(outs) > 0
	})
	if len(outs) != 1 {
		h.T.Fatalf("turn %s has %d outcome events, want exactly 1", turnID, len(outs))
	}
	return outs[0]
}

// Requested returns the approval-requested events of turnID.
func (h *H) Requested(turnID string) []*schemas.ApprovalRecord {
	h.T.Helper()
	return DecodeAll[schemas.ApprovalRecord](h.T, h.Events(topology.EventSubject(topology.SubjectApprovalRequested, turnID)))
}

// Decided returns the approval-decided events of turnID.
func (h *H) Decided(turnID string) []*schemas.DecidedEvent {
	h.T.Helper()
	return DecodeAll[schemas.DecidedEvent](h.T, h.Events(topology.EventSubject(topology.SubjectApprovalDecided, turnID)))
}

// Rejections returns the decision rejections stored under token (an approval
// id, or "invalid").
func (h *H) Rejections(token string) []*schemas.DecisionRejected {
	h.T.Helper()
	return DecodeAll[schemas.DecisionRejected](h.T, h.Events(topology.EventSubject(topology.SubjectDecisionRejected, token)))
}

// WaitRejection waits for the rejection of decision d and returns it.
func (h *H) WaitRejection(d *schemas.Decision) *schemas.DecisionRejected {
	h.T.Helper()
	token := d.ApprovalID
	if !schemas.ValidKey(token) {
		token = "invalid"
	}
	var got *schemas.DecisionRejected
	jstest.Eventually(h.T, h.wait, "rejection of decision "+d.DecisionID, func() bool {
		for _, r := range h.Rejections(token) {
			if r.DecisionID == d.DecisionID {
				got = r
				return true
			}
		}
		return false
	})
	return got
}

// Redrives returns the redrive outcomes of turnID of kind ("*" for all).
func (h *H) Redrives(kind, turnID string) []*schemas.RedriveOutcome {
	h.T.Helper()
	return DecodeAll[schemas.RedriveOutcome](h.T, h.Events(topology.SubjectRedrive+kind+"."+turnID))
}

// WaitRedrives waits until at least n redrive outcomes of kind are stored
// for turnID and returns them all.
func (h *H) WaitRedrives(kind, turnID string, n int) []*schemas.RedriveOutcome {
	h.T.Helper()
	var got []*schemas.RedriveOutcome
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("%d redrive %s outcome(s) of %s", n, kind, turnID), func() bool {
		got = h.Redrives(kind, turnID)
		return len(got) >= n
	})
	return got
}

// DLQ returns the dead letters of stage.
func (h *H) DLQ(stage string) []Stored {
	h.T.Helper()
	return h.Messages(topology.StreamDLQ, topology.DLQSubject(stage))
}

// WaitDLQ waits until stage has at least n dead letters and returns them.
func (h *H) WaitDLQ(stage string, n int) []Stored {
	h.T.Helper()
	var got []Stored
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("%d dead letter(s) of %s", n, stage), func() bool {
		got = h.DLQ(stage)
		return len(got) >= n
	})
	return got
}

// consumers are the durable consumers of the stages.
var consumers = map[string]topology.ConsumerSpec{
	Ingest:   topology.IngestConsumer(),
	Executor: topology.ExecutorConsumer(),
	Approver: topology.ApproverConsumer(),
	Redriver: topology.RedriverConsumer(),
}

// WaitConsumed waits until stage has acknowledged (or terminated) every
// message of its stream up to and including seq: proof that the stage has
// finished with it.
func (h *H) WaitConsumed(stage string, seq uint64) {
	h.T.Helper()
	sc, ok := consumers[stage]
	if !ok {
		h.T.Fatalf("pipelinetest: unknown stage %q", stage)
	}
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("%s consumed up to seq %d", stage, seq), func() bool {
		ctx, cancel := h.Ctx()
		defer cancel()
		c, err := h.JS.Consumer(ctx, sc.Stream, sc.Config.Durable)
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.AckFloor.Stream >= seq
	})
}

// WaitIdle waits until each stage's consumer has nothing pending and
// nothing unacknowledged: every message stored so far is handled.
func (h *H) WaitIdle(stages ...string) {
	h.T.Helper()
	for _, stage := range stages {
		sc, ok := consumers[stage]
		if !ok {
			h.T.Fatalf("pipelinetest: unknown stage %q", stage)
		}
		jstest.Eventually(h.T, h.wait, stage+" idle", func() bool {
			ctx, cancel := h.Ctx()
			defer cancel()
			c, err := h.JS.Consumer(ctx, sc.Stream, sc.Config.Durable)
			if err != nil {
				return false
			}
			info, err := c.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		})
	}
}

// ----- side effects -----

// File reads path inside the write_file sandbox.
func (h *H) File(path string) (content string, exists bool) {
	h.T.Helper()
	b, err := os.ReadFile(filepath.Join(h.Sandbox, path))
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	if err != nil {
		h.T.Fatalf("pipelinetest: read %s: %v", path, err)
	}
	return string(b), true
}

// RemoveFile removes path from the sandbox if it exists.
func (h *H) RemoveFile(path string) {
	h.T.Helper()
	if err := os.Remove(filepath.Join(h.Sandbox, path)); err != nil && !errors.Is(err, os.ErrNotExist) {
		h.T.Fatalf("pipelinetest: remove %s: %v", path, err)
	}
}

// SandboxFiles lists every regular file in the sandbox (relative paths).
func (h *H) SandboxFiles() []string {
	h.T.Helper()
	var out []string
	err := filepath.WalkDir(h.Sandbox, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(h.Sandbox, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		h.T.Fatalf("pipelinetest: walk sandbox: %v", err)
	}
	slices.Sort(out)
	return out
}

// Counter is a test tool that counts its runs per call id and records the
// TurnContext each ran under.
type Counter struct {
	ToolName string // default "count"

	mu    sync.Mutex
	runs  map[string]int
	calls []tools.Call
}

// Name implements tools.Tool.
func (c *Counter) Name() string {
	if c.ToolName == "" {
		return "count"
	}
	return c.ToolName
}

// Run implements tools.Tool.
func (c *Counter) Run(_ context.Context, call tools.Call) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string]int{}
	}
	c.runs[call.CallID]++
	c.calls = append(c.calls, call)
	return fmt.Sprintf("run %d of %s", c.runs[call.CallID], call.CallID), nil
}

// Runs returns how often callID ran.
func (c *Counter) Runs(callID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[callID]
}

// Total returns how many runs there were in all.
func (c *Counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// Calls returns every call the tool received, in order.
func (c *Counter) Calls() []tools.Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// Remote is a test tool that describes itself like a provider's tool (its
// Spec is Desc, with Name and RetrySafe taken from the tool), counts its
// runs like Counter, and then returns Fail's error for the call, if Fail is
// set and returns one.
type Remote struct {
	Counter
	Desc tools.Spec
	Safe bool
	Fail func(tools.Call) error
}

// Spec implements tools.Describer.
func (r *Remote) Spec() tools.Spec { return r.Desc }

// RetrySafe implements tools.Retryable.
func (r *Remote) RetrySafe() bool { return r.Safe }

// Run implements tools.Tool.
func (r *Remote) Run(ctx context.Context, call tools.Call) (string, error) {
	out, _ := r.Counter.Run(ctx, call)
	if r.Fail != nil {
		if err := r.Fail(call); err != nil {
			return "", err
		}
	}
	return out, nil
}

// Provider is a tools.Provider whose tools a test sets, and changes while
// the pipeline runs (a tool service that appears, a tool that disappears
// after its call was approved), or makes fail to list them.
type Provider struct {
	ProviderName string // default "test"

	mu    sync.Mutex
	tools []tools.Tool
	err   error
}

// Name implements tools.Provider.
func (p *Provider) Name() string {
	if p.ProviderName == "" {
		return "test"
	}
	return p.ProviderName
}

// Tools implements tools.Provider.
func (p *Provider) Tools(context.Context) ([]tools.Tool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.tools), p.err
}

// Set replaces the provider's tools.
func (p *Provider) Set(ts ...tools.Tool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tools = ts
}

// Fail makes Tools fail with err (nil: list them again).
func (p *Provider) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

// ----- metrics -----

// Metric returns the value of the counter or gauge name whose labels include
// labels, summed over matching series; 0 if there is none.
func (h *H) Metric(name string, labels map[string]string) float64 {
	h.T.Helper()
	mfs, err := h.Registry.Gather()
	if err != nil {
		h.T.Fatalf("pipelinetest: gather: %v", err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// WaitMetric polls Metric until it equals want.
func (h *H) WaitMetric(name string, labels map[string]string, want float64) {
	h.T.Helper()
	jstest.Eventually(h.T, h.wait, fmt.Sprintf("metric %s%v == %v", name, labels, want), func() bool {
		return h.Metric(name, labels) == want
	})
}
