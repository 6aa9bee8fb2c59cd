package tollgate_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/planner"
	"github.com/tollgate-dev/tollgate/pipeline/planner/plannertest"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tracing"
)

// approvalPolicy requires an approval for shout.
const approvalPolicy = `{
  "tools": {"shout": {"approval": "required"}},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// runPipeline runs a pipeline built by New with cfg (its policy
// approvalPolicy, its tool shout) until the end of the test, and returns a
// harness on the same server that runs nothing: the test plays the
// transport with it.
func runPipeline(t *testing.T, env *jstest.Env, cfg tollgate.Config) *pipelinetest.H {
	t.Helper()
	pol, err := policy.Parse([]byte(approvalPolicy))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Policy, cfg.Tools = pol, []tools.Tool{shout{"shout"}}
	p, err := tollgate.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	})
	return pipelinetest.Start(t, pipelinetest.Options{Env: env, Stages: []string{}, Policy: approvalPolicy})
}

// approvalTurn plays a transport through one turn whose call needs an
// approval: it sends the inbound message and, once the approval is
// pending, alice's approval, each with the headers hdr (a transport's
// trace context, or nil). It returns the turn id, the approval as
// requested and the outcome.
func approvalTurn(t *testing.T, h *pipelinetest.H, hdr nats.Header) (string, *schemas.ApprovalRecord, *schemas.TurnOutcome) {
	t.Helper()
	m := h.Inbound("s-1", "alice", pipelinetest.Call("shout", `{"text":"hi"}`))
	h.PublishRaw(topology.InboundSubject(m.Transport, m.SessionID), topology.InboundMsgID(m.Transport, m.MessageID), encode(t, m), hdr)
	turn := schemas.TurnID(m.Transport, m.MessageID)
	a := h.WaitPending(schemas.ApprovalID(turn, 0))
	// The decision goes out once the batch waits for it (its turn log's
	// awaiting event; the executor announces nothing): then the decided
	// event's redrive starts the batch and runs the call at its first
	// delivery. Sent earlier, the decided event can reach the redriver
	// while the batch is still running, and is NAKed until it waits (one
	// more redrive span).
	h.WaitState(turn, schemas.BatchAwaiting)
	d := h.Decision(a.ApprovalID, schemas.OptionApprove, "cli", "alice")
	h.PublishRaw(topology.DecisionSubject(d.Transport, d.ApprovalID), topology.DecisionMsgID(d.DecisionID), encode(t, d), hdr)
	b, out := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || len(out.Results) != 1 || out.Results[0].Output != "HI" {
		t.Fatalf("turn ended %s (%s): %+v", b.State, b.Code, out.Results)
	}
	return turn, a, out
}

func encode(t *testing.T, r schemas.Record) []byte {
	t.Helper()
	data, err := schemas.Encode(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// attr is the value of span s's attribute key, "" when it has none.
func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// spanSet is what the exporter holds, by what each span is.
type spanSet []sdktrace.ReadOnlySpan

// of returns the spans named name whose subject starts with subject ("":
// any).
func (ss spanSet) of(name, subject string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range ss {
		if s.Name() == name && strings.HasPrefix(attr(s, "messaging.destination.name"), subject) {
			out = append(out, s)
		}
	}
	return out
}

// One approval turn, from the inbound message a transport sends with its
// trace context to the outcome, is one trace: every stage's span is in
// it, each the child of the span that published its message, the tool
// call is a span of the redrive, and the redrive links to the span that
// requested the approval instead of descending from it across the wait.
func TestOneApprovalTurnIsOneTrace(t *testing.T) {
	env := jstest.Start(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(exp)))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := config(t, env)
	cfg.TracerProvider = tp
	h := runPipeline(t, env, cfg)

	// The transport's own span, whose context its messages carry.
	tctx, transport := tracing.Tracer(tp).Start(context.Background(), "transport")
	turn, requested, out := approvalTurn(t, h, tracing.Inject(tctx, nil))
	transport.End()

	// The stages end their spans once they have settled their messages,
	// just after the facts the turn waited for: wait for the last ones.
	var spans spanSet
	jstest.EventuallyState(t, pipelinetest.Wait, "the stages' spans", func() (bool, string) {
		spans = nil
		for _, s := range exp.GetSpans().Snapshots() {
			spans = append(spans, s)
		}
		return len(spans.of("ingest", "")) > 0 && len(spans.of("approver", "")) > 0 &&
			len(spans.of("redriver", topology.ApprovalRevisionPrefix)) > 1 && len(spans.of("tool shout", "")) > 0, fmt.Sprint(names(spans))
	})

	traceID := transport.SpanContext().TraceID()
	for _, s := range spans {
		if s.SpanContext().TraceID() != traceID {
			t.Errorf("span %s (%s) is in trace %v, want the transport's %v", s.Name(), attr(s, "messaging.destination.name"), s.SpanContext().TraceID(), traceID)
		}
	}
	one := func(name, subject string) sdktrace.ReadOnlySpan {
		t.Helper()
		got := spans.of(name, subject)
		if len(got) != 1 {
			t.Fatalf("%d %s spans on %s*, want 1: %v", len(got), name, subject, names(spans))
		}
		return got[0]
	}
	childOf := func(s sdktrace.ReadOnlySpan, parent trace.SpanContext, what string) {
		t.Helper()
		if s.Parent().SpanID() != parent.SpanID() {
			t.Errorf("span %s has parent %v, want %s %v", s.Name(), s.Parent().SpanID(), what, parent.SpanID())
		}
	}
	ingest := one("ingest", "")
	childOf(ingest, transport.SpanContext(), "the transport's span")
	executors := spans.of("executor", topology.SubjectTurnOrder)
	if len(executors) == 0 {
		t.Fatalf("no executor span of the accepted turn: %v", names(spans))
	}
	for _, x := range executors {
		childOf(x, ingest.SpanContext(), "ingest's span")
	}
	approver := one("approver", "")
	childOf(approver, transport.SpanContext(), "the transport's span (the decision's)")
	// The redriver hears each revision of the approval: its creation
	// (the executor's write, nothing to do) and its decision (the
	// approver's write, whose span it continues).
	var redrive sdktrace.ReadOnlySpan
	for _, s := range spans.of("redriver", topology.ApprovalRevisionPrefix) {
		if s.Parent().SpanID() == approver.SpanContext().SpanID() {
			if redrive != nil {
				t.Fatalf("two redriver spans of the decision: %v", names(spans))
			}
			redrive = s
		}
	}
	if redrive == nil {
		t.Fatalf("no redriver span is the child of the approver's span (the decision's revision): %v", names(spans))
	}
	tool := one("tool shout", "")
	childOf(tool, redrive.SpanContext(), "the redrive's span")
	for _, s := range []sdktrace.ReadOnlySpan{ingest, approver, redrive} {
		if got := attr(s, string(tracing.AttrOutcome)); got != tracing.OutcomeAck {
			t.Errorf("span %s outcome %q, want %q", s.Name(), got, tracing.OutcomeAck)
		}
	}
	if got := attr(redrive, string(tracing.AttrTurnID)); got != turn {
		t.Errorf("redrive span's turn id %q, want %q", got, turn)
	}
	if got := attr(approver, string(tracing.AttrApprovalID)); got != requested.ApprovalID {
		t.Errorf("approver span's approval id %q, want %q", got, requested.ApprovalID)
	}

	// The wait: the approval remembers the span that requested it (an
	// executor span), and the redrive links to that span.
	reqCtx := trace.SpanContextFromContext(tracing.Extract(context.Background(), nats.Header{"traceparent": {requested.Trace["traceparent"]}}))
	i := slices.IndexFunc(executors, func(x sdktrace.ReadOnlySpan) bool { return x.SpanContext().SpanID() == reqCtx.SpanID() })
	if i < 0 {
		t.Fatalf("the approval's trace context %v names no executor span of the turn", requested.Trace)
	}
	links := redrive.Links()
	if len(links) != 1 || links[0].SpanContext.SpanID() != reqCtx.SpanID() || links[0].SpanContext.TraceID() != traceID {
		t.Fatalf("redrive links %+v, want one to the requesting span %v", links, reqCtx.SpanID())
	}
	if redrive.Parent().SpanID() == reqCtx.SpanID() {
		t.Fatal("the redrive is the requesting span's child across the wait")
	}

	// What the redrive wrote carries its span: the outcome (its turn
	// log's outcome event, the write that ended the batch) continues the
	// trace, for the transports that follow it.
	if n := len(h.Outcomes(turn)); n != 1 || out.TurnID != turn {
		t.Fatalf("%d outcomes, want 1", n)
	}
	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), h.OutcomeEvent(turn).Header))
	if got.TraceID() != traceID || got.SpanID() != redrive.SpanContext().SpanID() {
		t.Fatalf("outcome carries %v/%v, want the redrive's span %v/%v", got.TraceID(), got.SpanID(), traceID, redrive.SpanContext().SpanID())
	}
}

// Without a TracerProvider nothing is traced: no header is added to what
// the stages publish and the approval records no trace context. A trace
// context that a transport sent is passed on as it came, with no span of
// Tollgate's in between.
func TestWithoutATracerProviderNothingIsAdded(t *testing.T) {
	env := jstest.Start(t)
	h := runPipeline(t, env, config(t, env))
	traceHeaders := func(hdr nats.Header) []string {
		var out []string
		for k := range hdr {
			if k := strings.ToLower(k); k == "traceparent" || k == "tracestate" {
				out = append(out, k+"="+hdr.Get(k))
			}
		}
		return out
	}
	stored := func() []pipelinetest.Stored {
		msgs := append(h.Messages(topology.StreamTurns, ">"), h.Events(">")...)
		msgs = append(msgs, h.Messages(topology.StreamApprovals, topology.ApprovalRevisions)...)
		for i := range topology.DefaultTurnLogPartitions {
			msgs = append(msgs, h.Messages(topology.TurnLogStream(i), ">")...)
		}
		return msgs
	}

	t.Run("a message without a trace context", func(t *testing.T) {
		_, requested, _ := approvalTurn(t, h, nil)
		if requested.Trace != nil {
			t.Errorf("approval records trace context %v", requested.Trace)
		}
		msgs := stored()
		if len(msgs) < 6 { // accepted; the approval decided (the bucket keeps its last revision); the batch's running, awaiting (the request), started and outcome events in its turn log
			t.Fatalf("only %d messages stored", len(msgs))
		}
		for _, m := range msgs {
			if hs := traceHeaders(m.Header); len(hs) > 0 {
				t.Errorf("%s carries %v", m.Subject, hs)
			}
		}
	})
	t.Run("a message with a transport's trace context", func(t *testing.T) {
		const sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		seen := map[string]bool{}
		for _, m := range stored() {
			seen[m.Subject+"#"+strconv.FormatUint(m.Seq, 10)] = true
		}
		approvalTurn(t, h, nats.Header{"traceparent": {sent}})
		for _, m := range stored() {
			if seen[m.Subject+"#"+strconv.FormatUint(m.Seq, 10)] {
				continue
			}
			if hs := traceHeaders(m.Header); len(hs) != 1 || hs[0] != "traceparent="+sent {
				t.Errorf("%s carries %v, want the transport's traceparent as it came", m.Subject, hs)
			}
		}
	})
}

func names(spans spanSet) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name()+" "+attr(s, "messaging.destination.name"))
	}
	return out
}

// A planner turn's model call is a span of the planner's handler, in the
// trace of the message that asked.
func TestAModelCallIsASpanOfThePlannersHandler(t *testing.T) {
	env := jstest.Start(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(exp)))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	model := plannertest.New(t)
	model.Script("hello", plannertest.Reply{Text: "Hi."})
	cfg := config(t, env)
	cfg.TracerProvider = tp
	cfg.Planner = &planner.Options{Model: planner.ModelConfig{BaseURL: model.URL, Model: "scripted", Timeout: 10 * time.Second}}
	h := runPipeline(t, env, cfg)

	tctx, transport := tracing.Tracer(tp).Start(context.Background(), "transport")
	m := h.Inbound("s-1", "alice")
	m.Text = "hello"
	h.PublishRaw(topology.InboundSubject(m.Transport, m.SessionID), topology.InboundMsgID(m.Transport, m.MessageID), encode(t, m), tracing.Inject(tctx, nil))
	transport.End()
	if out := h.WaitOutcome(schemas.TurnID(m.Transport, m.MessageID)); out.State != schemas.TurnCompleted {
		t.Fatalf("outcome %+v, want completed", out)
	}
	var call sdktrace.ReadOnlySpan
	jstest.Eventually(t, pipelinetest.Wait, "the model call's span", func() bool {
		for _, s := range exp.GetSpans().Snapshots() {
			if s.Name() == "model scripted" {
				call = s
				return true
			}
		}
		return false
	})
	if call.SpanContext().TraceID() != transport.SpanContext().TraceID() || call.SpanKind() != trace.SpanKindClient {
		t.Fatalf("model span in trace %v (kind %v), want the transport's %v, client", call.SpanContext().TraceID(), call.SpanKind(), transport.SpanContext().TraceID())
	}
	// The handler's span is exported when it ends, after the handler has
	// published the outcome the test waited for: wait for it too.
	var parent sdktrace.ReadOnlySpan
	jstest.Eventually(t, pipelinetest.Wait, "the model call's parent span", func() bool {
		for _, s := range exp.GetSpans().Snapshots() {
			if s.SpanContext().SpanID() == call.Parent().SpanID() {
				parent = s
				return true
			}
		}
		return false
	})
	if parent.Name() != "planner" {
		t.Fatalf("model span's parent %v, want the planner stage's span (spans: %v)", parent, names(spanSet(exp.GetSpans().Snapshots())))
	}
}
