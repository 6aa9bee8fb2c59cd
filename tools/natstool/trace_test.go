package natstool_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
	"github.com/tollgate-dev/tollgate/tracing"
)

func TestARequestCarriesTheCallsTraceContext(t *testing.T) {
	env := jstest.Start(t)
	headers := make(chan nats.Header, 2)
	addService(t, connect(t, env), "traced", endpoint{name: "op", handler: func(req micro.Request) {
		headers <- nats.Header(req.Headers())
		answer(req, "ok")
	}})
	tl := lookup(t, newProvider(env, natstool.Options{}), "traced.op")
	call := func(ctx context.Context) nats.Header {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := tl.Run(ctx, tools.Call{Context: turnContext(), CallID: "cli:m-1-0", Args: `{}`}); err != nil {
			t.Fatal(err)
		}
		return <-headers
	}

	t.Run("a traced call sends the span's traceparent, which a service continues", func(t *testing.T) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		ctx, span := tracing.Tracer(tp).Start(context.Background(), "tool traced.op")
		defer span.End()
		h := call(ctx)
		if h.Get(natstool.HeaderCallID) != "cli:m-1-0" {
			t.Fatalf("call id header lost: %v", h)
		}
		got := trace.SpanContextFromContext(tracing.Extract(context.Background(), h))
		if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() {
			t.Fatalf("the service continues %v/%v, want the call's span %v/%v (headers %v)",
				got.TraceID(), got.SpanID(), span.SpanContext().TraceID(), span.SpanContext().SpanID(), h)
		}
	})
	t.Run("an untraced call sends no trace header", func(t *testing.T) {
		h := call(context.Background())
		if len(h) != 1 || h.Get(natstool.HeaderCallID) == "" {
			t.Fatalf("headers %v, want only %s", h, natstool.HeaderCallID)
		}
	})
}
