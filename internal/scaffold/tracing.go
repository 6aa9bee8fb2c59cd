package scaffold

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The standard OpenTelemetry variables that turn OTLP trace export on.
const (
	EnvOTLPEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvOTLPTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// OTLPFlag adds --otlp to fs: the OTLP/HTTP endpoint to export traces to.
func OTLPFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "otlp", "", "export traces over OTLP/HTTP to this URL, e.g. http://127.0.0.1:4318 (/v1/traces is added to a URL without a path); "+
		"empty: only when "+EnvOTLPEndpoint+" or "+EnvOTLPTracesEndpoint+" is set; traces are off otherwise (docs/operations.md, Traces)")
}

// Tracing turns tracing on for a process called service when it is
// configured: endpoint (--otlp) is set, or the environment names an OTLP
// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
// the exporter reads the other OTEL_EXPORTER_OTLP_* variables, such as
// headers and timeouts, too). It then installs, as otel's global
// provider (which tollgate.Config.TracerProvider and gateway.Config's
// default to), a provider that batches spans and exports them over
// OTLP/HTTP, with the resource attribute service.name = service
// (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over it) and the
// sampler of OTEL_TRACES_SAMPLER (default: every trace, or as its parent
// says).
//
// Not configured, it does nothing: no exporter, no network, and the
// returned shutdown is a no-op. Configured, shutdown flushes the spans
// not yet exported, within its context; call it before the process exits.
// An endpoint that is not an http or https URL is an error.
func Tracing(ctx context.Context, endpoint, service string, log *slog.Logger) (shutdown func(context.Context) error, err error) {
	none := func(context.Context) error { return nil }
	var opts []otlptracehttp.Option
	switch {
	case endpoint != "":
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return none, fmt.Errorf("--otlp %q: want an http or https URL", endpoint)
		}
		if strings.Trim(u.Path, "/") == "" {
			u.Path = "/v1/traces"
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		endpoint = u.String()
	case os.Getenv(EnvOTLPTracesEndpoint) != "":
		endpoint = os.Getenv(EnvOTLPTracesEndpoint)
	case os.Getenv(EnvOTLPEndpoint) != "":
		endpoint = os.Getenv(EnvOTLPEndpoint)
	default:
		return none, nil
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return none, fmt.Errorf("otlp exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	switch {
	case errors.Is(err, resource.ErrPartialResource): // e.g. a malformed OTEL_RESOURCE_ATTRIBUTES
		log.Warn("trace resource attributes partly read", "err", err)
	case err != nil:
		return none, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("trace export", "err", err) }))
	otel.SetTracerProvider(tp)
	log.Info("exporting traces over OTLP", "endpoint", endpoint, "service", service)
	return tp.Shutdown, nil
}

// FlushTraces calls shutdown (from Tracing) with a few seconds to export
// what is left, logging a failure; for a deferred call at exit.
func FlushTraces(shutdown func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		log.Warn("traces not all exported at exit", "err", err)
	}
}
