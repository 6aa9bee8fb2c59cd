package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/tracing"
)

// Each request Serve serves is a server span, the child of the client's
// traceparent, and the inbound message a submit publishes carries it.
func TestARequestIsASpanAndWhatItPublishesCarriesIt(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) { c.TracerProvider = tp })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- g.s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	g.url = "http://" + ln.Addr().String()

	cctx, client := tracing.Tracer(tp).Start(context.Background(), "client")
	client.End()
	resp, body := g.do("POST", "/v1/turns", "a", SubmitRequest{
		SessionID: "s-trace", Sender: SenderIn{ID: "alice"}, Calls: []CallIn{call("echo", `{"text":"hi"}`)},
	}, "Idempotency-Key", "req-trace", "traceparent", tracing.Context(cctx)["traceparent"])
	want[SubmitResponse](t, resp, body, http.StatusAccepted)

	var server sdktrace.ReadOnlySpan
	jstest.EventuallyState(t, jstest.Wait, "a server span", func() (bool, string) {
		var kinds []string
		for _, s := range exp.GetSpans().Snapshots() {
			if s.SpanKind() == trace.SpanKindServer {
				server = s
			}
			kinds = append(kinds, s.Name()+" ("+s.SpanKind().String()+")")
		}
		return server != nil, fmt.Sprintf("spans %v", kinds)
	})
	if server.Name() != "POST /v1/turns" || server.Parent().SpanID() != client.SpanContext().SpanID() {
		t.Fatalf("span %q with parent %v, want POST /v1/turns under the client's %v", server.Name(), server.Parent().SpanID(), client.SpanContext().SpanID())
	}
	var status int64
	for _, a := range server.Attributes() {
		if a.Key == "http.response.status_code" {
			status = a.Value.AsInt64()
		}
	}
	if status != http.StatusAccepted {
		t.Errorf("status attribute %d, want 202", status)
	}
	msgs := g.Messages(topology.StreamInbound, topology.InboundSubject("gateway", "s-trace"))
	if len(msgs) != 1 {
		t.Fatalf("%d inbound messages, want 1", len(msgs))
	}
	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), msgs[0].Header))
	if got.SpanID() != server.SpanContext().SpanID() || got.TraceID() != client.SpanContext().TraceID() {
		t.Fatalf("the inbound message carries %v/%v, want the request's span %v", got.TraceID(), got.SpanID(), server.SpanContext().SpanID())
	}
}
