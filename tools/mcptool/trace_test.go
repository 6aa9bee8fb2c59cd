package mcptool_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tollgate-dev/tollgate/tools/mcptool"
	"github.com/tollgate-dev/tollgate/tracing"
)

func TestACallCarriesItsTraceContextInMeta(t *testing.T) {
	srv := newTestServer(t, "tools")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"t": srv.ServerConfig}}, fast())
	run(t, p)
	tl := waitTool(t, p, "t.traceparent")

	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tracing.Tracer(tp).Start(context.Background(), "tool t.traceparent")
	defer span.End()
	want := tracing.Context(ctx)["traceparent"]
	if out, err := call(t, ctx, tl, `{}`); err != nil || out != want {
		t.Fatalf("the server got traceparent %q (%v), want the call's span %q", out, err, want)
	}
	if out, err := call(t, context.Background(), tl, `{}`); err != nil || out != "<nil>" {
		t.Fatalf("an untraced call sent traceparent %q (%v), want none", out, err)
	}
}
