package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/tracing"
)

const (
	traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	spanID      = "00f067aa0ba902b7"
	traceparent = "00-" + traceID + "-" + spanID + "-01"
)

// newProvider is an SDK provider recording into an in-memory exporter.
func newProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func TestHeaderCarrierRoundTrip(t *testing.T) {
	tp, _ := newProvider(t)
	ctx, span := tracing.Tracer(tp).Start(context.Background(), "sender")
	defer span.End()
	ts, err := trace.ParseTraceState("vendor=value")
	if err != nil {
		t.Fatal(err)
	}
	sent := span.SpanContext().WithTraceState(ts)
	ctx = trace.ContextWithSpanContext(ctx, sent)

	orig := nats.Header{"Tollgate-Call-Id": {"c1"}}
	h := tracing.Inject(ctx, orig)
	if got := h["traceparent"]; len(got) != 1 {
		t.Fatalf("traceparent written as %v, want one lowercase value; headers %v", got, h)
	}
	if got := h["tracestate"]; len(got) != 1 || got[0] != "vendor=value" {
		t.Fatalf("tracestate = %v, want [vendor=value]", got)
	}
	if h.Get("Tollgate-Call-Id") != "c1" {
		t.Fatalf("other headers lost: %v", h)
	}
	if _, ok := orig["traceparent"]; ok {
		t.Fatal("Inject changed the header it was given")
	}

	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), h))
	if !got.IsRemote() || got.TraceID() != sent.TraceID() || got.SpanID() != sent.SpanID() || got.TraceState().String() != "vendor=value" || !got.IsSampled() {
		t.Fatalf("extracted %+v, want the sent span context %+v", got, sent)
	}
}

func TestHeaderCarrierReadsAnyCase(t *testing.T) {
	for _, key := range []string{"traceparent", "Traceparent", "TRACEPARENT", "TraceParent"} {
		t.Run(key, func(t *testing.T) {
			h := nats.Header{key: {traceparent}}
			sc := trace.SpanContextFromContext(tracing.Extract(context.Background(), h))
			if sc.TraceID().String() != traceID || sc.SpanID().String() != spanID {
				t.Fatalf("extracted %v/%v from %s, want %s/%s", sc.TraceID(), sc.SpanID(), key, traceID, spanID)
			}
		})
	}
}

func TestHeaderCarrierSetReplacesCaseVariants(t *testing.T) {
	h := nats.Header{"Traceparent": {"00-" + traceID + "-1111111111111111-01"}, "TRACEPARENT": {"stale"}}
	tracing.Header(h).Set("traceparent", traceparent)
	if len(h) != 1 || h.Get("traceparent") != traceparent {
		t.Fatalf("headers after Set: %v, want only traceparent=%s", h, traceparent)
	}
}

func TestMalformedTraceparentIsIgnored(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"empty", ""},
		{"garbage", "not a traceparent"},
		{"all-zero trace id", "00-00000000000000000000000000000000-" + spanID + "-01"},
		{"all-zero span id", "00-" + traceID + "-0000000000000000-01"},
		{"short trace id", "00-4bf92f3577b34da6-" + spanID + "-01"},
		{"version ff", "ff-" + traceID + "-" + spanID + "-01"},
		{"upper-case hex", "00-4BF92F3577B34DA6A3CE929D0E0E4736-" + spanID + "-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tracing.Extract(context.Background(), nats.Header{"traceparent": {tc.value}, "tracestate": {"a=b"}})
			if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
				t.Fatalf("extracted %v from a malformed traceparent", sc)
			}
		})
	}
}

func TestInjectWithoutSpanWritesNothing(t *testing.T) {
	if h := tracing.Inject(context.Background(), nil); h != nil {
		t.Fatalf("Inject without a span = %v, want nil", h)
	}
	h := nats.Header{"A": {"b"}}
	if got := tracing.Inject(context.Background(), h); len(got) != 1 {
		t.Fatalf("Inject without a span = %v, want the header unchanged", got)
	}
	if tc := tracing.Context(context.Background()); tc != nil {
		t.Fatalf("Context without a span = %v, want nil", tc)
	}
}

func TestContextAndLink(t *testing.T) {
	tp, exp := newProvider(t)
	tracer := tracing.Tracer(tp)
	reqCtx, req := tracer.Start(context.Background(), "request")
	tc := tracing.Context(reqCtx)
	req.End()
	if tc["traceparent"] == "" {
		t.Fatalf("Context = %v, want a traceparent", tc)
	}

	ctx, later := tracer.Start(context.Background(), "later")
	tracing.Link(ctx, tc)
	tracing.Link(ctx, nil)                                       // nothing persisted: no link
	tracing.Link(ctx, map[string]string{"traceparent": "bogus"}) // malformed: no link
	later.End()

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	got := spans[1]
	if len(got.Links) != 1 || got.Links[0].SpanContext.SpanID() != req.SpanContext().SpanID() {
		t.Fatalf("links %+v, want one to the request span %v", got.Links, req.SpanContext().SpanID())
	}
	if got.Parent.IsValid() {
		t.Fatalf("the linked span has parent %v, want none", got.Parent)
	}
}

func TestStartFollowsTheSpanInContext(t *testing.T) {
	tp, exp := newProvider(t)
	ctx, parent := tracing.Tracer(tp).Start(context.Background(), "parent")
	_, child := tracing.Start(ctx, "child")
	child.End()
	parent.End()
	spans := exp.GetSpans()
	if len(spans) != 2 || spans[0].Name != "child" || spans[0].Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("spans %v, want child under parent", spans)
	}

	_, orphan := tracing.Start(context.Background(), "no parent")
	orphan.End()
	if orphan.IsRecording() || len(exp.GetSpans()) != 2 {
		t.Fatal("Start without a span in ctx recorded a span")
	}
}

func TestHTTPMiddleware(t *testing.T) {
	tp, exp := newProvider(t)
	var inHandler trace.SpanContext
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/turns/{id}", func(w http.ResponseWriter, r *http.Request) {
		inHandler = trace.SpanContextFromContext(r.Context())
		tracing.SetHTTPStatus(r.Context(), http.StatusAccepted)
		w.WriteHeader(http.StatusAccepted)
	})
	req := httptest.NewRequest(http.MethodPost, "/v1/turns/t1", nil)
	req.Header.Set("Traceparent", traceparent)
	tracing.HTTP(tp, mux).ServeHTTP(httptest.NewRecorder(), req)

	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Name != "POST /v1/turns/{id}" || s.SpanKind != trace.SpanKindServer {
		t.Fatalf("span %q kind %v, want POST /v1/turns/{id}, server", s.Name, s.SpanKind)
	}
	if s.Parent.TraceID().String() != traceID || s.Parent.SpanID().String() != spanID {
		t.Fatalf("parent %v, want the client's %s", s.Parent, traceparent)
	}
	if inHandler.SpanID() != s.SpanContext.SpanID() {
		t.Fatal("the handler's context does not hold the request's span")
	}
	var status int64
	for _, a := range s.Attributes {
		if a.Key == "http.response.status_code" {
			status = a.Value.AsInt64()
		}
	}
	if status != http.StatusAccepted {
		t.Fatalf("status attribute %d, want 202", status)
	}
}
