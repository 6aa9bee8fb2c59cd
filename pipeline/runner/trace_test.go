package runner_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
)

// Each delivery is a span of the runner's provider: the child of the
// message's traceparent, in the context the handler publishes with, and
// marked with how the message was settled.
func TestEachDeliveryIsASpan(t *testing.T) {
	h := newHarness(t, "tracer")
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	h.cfg.TracerProvider = tp
	h.cfg.BaseDelay = 10 * time.Millisecond
	failed := map[string]bool{}
	h.run(func(ctx context.Context, m jetstream.Msg) error {
		switch runner.LastToken(m) { // one worker: no lock needed
		case "first": // publishes the next message, in the handler's span
			return bus.PublishRaw(ctx, h.env.JS, subject("second"), "", []byte("next"), nil)
		case "flaky": // fails once, then succeeds
			if !failed["flaky"] {
				failed["flaky"] = true
				return errors.New("not yet")
			}
		case "bad":
			return schemas.Errorf(schemas.CodeInvalidInput, "never")
		}
		return nil
	})

	tctx, root := tracing.Tracer(tp).Start(context.Background(), "transport")
	root.End()
	h.publish(subject("first"), []byte("x"), tracing.Inject(tctx, nil))
	h.publish(subject("flaky"), []byte("x"), nil)
	h.publish(subject("bad"), []byte("x"), nil)
	dead := h.waitDeadLetters(1)

	// by key: the spans of the message whose subject ends in key.
	var by map[string][]sdktrace.ReadOnlySpan
	jstest.Eventually(t, wait, "every delivery's span ended", func() bool {
		by = map[string][]sdktrace.ReadOnlySpan{}
		for _, s := range exp.GetSpans().Snapshots() {
			key := attrOf(s, string(tracing.AttrSessionKey))
			by[key] = append(by[key], s)
		}
		return len(by["first"]) == 1 && len(by["second"]) == 1 && len(by["flaky"]) == 2 && len(by["bad"]) == 1
	})

	first, second := by["first"][0], by["second"][0]
	if first.Name() != "tracer" || first.SpanKind() != trace.SpanKindConsumer || attrOf(first, "messaging.destination.name") != subject("first") {
		t.Errorf("span %q kind %v subject %q, want tracer, consumer, %s", first.Name(), first.SpanKind(), attrOf(first, "messaging.destination.name"), subject("first"))
	}
	if first.Parent().SpanID() != root.SpanContext().SpanID() || first.SpanContext().TraceID() != root.SpanContext().TraceID() {
		t.Errorf("first message's span has parent %v, want the sender's %v", first.Parent(), root.SpanContext())
	}
	if second.Parent().SpanID() != first.SpanContext().SpanID() {
		t.Errorf("the message the handler published is handled under parent %v, want the handler's span %v", second.Parent().SpanID(), first.SpanContext().SpanID())
	}
	for _, tc := range []struct {
		span sdktrace.ReadOnlySpan
		want string
	}{
		{first, tracing.OutcomeAck}, {second, tracing.OutcomeAck},
		{by["flaky"][0], tracing.OutcomeNak}, {by["flaky"][1], tracing.OutcomeAck},
		{by["bad"][0], tracing.OutcomeDeadLetter},
	} {
		if got := attrOf(tc.span, string(tracing.AttrOutcome)); got != tc.want {
			t.Errorf("span of %s: outcome %q, want %q", attrOf(tc.span, "messaging.destination.name"), got, tc.want)
		}
	}
	bad := by["bad"][0]
	if got := attrOf(bad, string(tracing.AttrCode)); got != string(schemas.CodeInvalidInput) {
		t.Errorf("dead-lettered span's code %q, want %s", got, schemas.CodeInvalidInput)
	}
	if by["bad"][0].Parent().IsValid() {
		t.Errorf("a message without a traceparent has a parent span: %v", bad.Parent())
	}
	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), nats.Header(dead[0].Header)))
	if got.SpanID() != bad.SpanContext().SpanID() {
		t.Errorf("dead letter carries span %v, want the dead-lettering span %v", got.SpanID(), bad.SpanContext().SpanID())
	}
}

// attrOf is the value of span s's attribute key, "" when it has none.
func attrOf(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}
