// Package tracing carries OpenTelemetry trace context across Tollgate:
// W3C Trace Context (traceparent, tracestate) in NATS message headers and
// HTTP headers, and the few helpers the stages, the tools and the gateway
// start their spans with.
//
// Tracing is off unless a program installs a TracerProvider (see
// tollgate.Config.TracerProvider; the binaries install an OTLP exporter
// only when one is configured). Off, spans are otel's no-op ones: nothing
// is recorded or exported, and Inject writes a header only to pass on a
// trace context that arrived with the message being handled.
//
// The propagator is always W3C Trace Context (propagation.TraceContext),
// whatever otel's global propagator is, so that every stage and tool
// service reads what the others write.
package tracing

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of Tollgate's spans.
const ScopeName = "github.com/tollgate-dev/tollgate"

// Span attributes Tollgate sets besides OpenTelemetry's conventional ones.
const (
	AttrStage      = attribute.Key("tollgate.stage")
	AttrTurnID     = attribute.Key("tollgate.turn_id")
	AttrApprovalID = attribute.Key("tollgate.approval_id")
	AttrSessionKey = attribute.Key("tollgate.session_key")
	AttrCallID     = attribute.Key("tollgate.call_id")
	AttrTool       = attribute.Key("tollgate.tool")
	// AttrOutcome is how a stage settled a message: OutcomeAck,
	// OutcomeNak, OutcomeDeadLetter or OutcomeTerm.
	AttrOutcome = attribute.Key("tollgate.outcome")
	AttrCode    = attribute.Key("tollgate.code") // a reason code (schemas.Code)
)

// Values of AttrOutcome.
const (
	OutcomeAck        = "ack"         // handled
	OutcomeNak        = "nak"         // to be redelivered (a transient failure, or waiting its turn)
	OutcomeDeadLetter = "dead_letter" // copied to the dead-letter stream and terminated
	OutcomeTerm       = "term"        // given up without a dead letter (see pipeline/runner)
)

var propagator = propagation.TraceContext{}

// Header is a nats.Header as an OpenTelemetry propagation.TextMapCarrier.
// nats.Header keys are case-sensitive, while W3C Trace Context names its
// headers case-insensitively: Get finds a key in any case (an exact match
// first), and Set writes the lowercase key, removing any other case
// variant of it so that one message never carries two traceparents.
type Header nats.Header

// Get returns the first value of key, matched exactly or else in any case;
// "" when there is none.
func (h Header) Get(key string) string {
	if vs := h[key]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// Set makes value the only value of key, written in lowercase.
func (h Header) Set(key, value string) {
	lower := strings.ToLower(key)
	for k := range h {
		if k != lower && strings.EqualFold(k, key) {
			delete(h, k)
		}
	}
	h[lower] = []string{value}
}

// Keys returns the header's keys.
func (h Header) Keys() []string { return slices.Collect(maps.Keys(h)) }

// Inject returns h with the trace context of the span in ctx written into
// it (traceparent, and tracestate when there is one). It does not change
// h: when there is something to write, it writes into a copy (a new header
// when h is nil). When ctx holds no valid span context, h itself is
// returned, nil staying nil.
func Inject(ctx context.Context, h nats.Header) nats.Header {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return h
	}
	out := make(nats.Header, len(h)+2)
	maps.Copy(out, h)
	propagator.Inject(ctx, Header(out))
	return out
}

// Extract returns ctx with the remote span context that h carries, as the
// parent of the spans started from it. A missing or malformed traceparent
// is ignored: ctx is returned as it is.
func Extract(ctx context.Context, h nats.Header) context.Context {
	return propagator.Extract(ctx, Header(h))
}

// Context returns the W3C trace context of the span in ctx (the keys
// traceparent and tracestate), to be persisted with a record that a later
// span links to (see Link); nil when ctx holds no valid span context.
func Context(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c
}

// Link adds to the span in ctx a link to the span whose trace context tc
// holds (as Context returned it), with attrs on the link. A nil, empty or
// malformed tc adds nothing.
func Link(ctx context.Context, tc map[string]string, attrs ...attribute.KeyValue) {
	sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), propagation.MapCarrier(tc)))
	if !sc.IsValid() {
		return
	}
	trace.SpanFromContext(ctx).AddLink(trace.Link{SpanContext: sc, Attributes: attrs})
}

// Tracer is Tollgate's tracer of tp; a nil tp is otel's global provider
// (a no-op one unless the program set another).
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(ScopeName)
}

// Start starts a span named name as a child of the span in ctx, with the
// tracer provider that started that span: a tool call, a model call or any
// other step of a handler. Where ctx holds no span (or a no-op one), the
// new span is a no-op one too, so that Start costs nothing when tracing is
// off. End it with End.
func Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(ScopeName).Start(ctx, name, opts...)
}

// End ends span, first recording err (when not nil) as its error status.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// HTTP wraps next so that each request is a server span of tp (nil: otel's
// global provider), a child of the trace context the request's headers
// carry (W3C traceparent) if any, named after the method and the route
// pattern that served it. The request's context holds the span, so that
// what the handler publishes carries it (pipeline/bus).
func HTTP(tp trace.TracerProvider, next http.Handler) http.Handler {
	tracer := Tracer(tp)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("url.path", r.URL.Path),
		))
		defer span.End()
		r = r.WithContext(ctx)
		next.ServeHTTP(w, r)
		if r.Pattern != "" { // set by http.ServeMux on the request it served
			span.SetName(r.Method + " " + routeOf(r.Pattern))
			span.SetAttributes(attribute.String("http.route", routeOf(r.Pattern)))
		}
	})
}

// SetHTTPStatus records the status code of the response to the request
// whose context is ctx on its span (see HTTP); a 5xx status marks the span
// as failed.
func SetHTTPStatus(ctx context.Context, status int) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
}

// routeOf is the path of a ServeMux pattern ("[METHOD ][HOST]/PATH").
func routeOf(pattern string) string {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return pattern
}
