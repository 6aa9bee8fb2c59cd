package scaffold_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
)

// collector is an OTLP/HTTP endpoint on loopback that counts the export
// requests it gets, by path.
type collector struct {
	*httptest.Server
	mu    sync.Mutex
	paths map[string]int
}

func newCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{paths: map[string]int{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		if r.Method == http.MethodPost && r.Header.Get("Content-Type") == "application/x-protobuf" {
			c.paths[r.URL.Path]++
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) exports(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paths[path]
}

// resetGlobal gives otel's global provider back a no-op one after the test.
func resetGlobal(t *testing.T) {
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
}

func TestTracingIsOffUnlessConfigured(t *testing.T) {
	t.Setenv(scaffold.EnvOTLPEndpoint, "")
	t.Setenv(scaffold.EnvOTLPTracesEndpoint, "")
	resetGlobal(t)
	shutdown, err := scaffold.Tracing(context.Background(), "", "tollgate-test", pipelinetest.Logger())
	if err != nil {
		t.Fatal(err)
	}
	if _, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider); sdk {
		t.Fatal("a provider was installed without an endpoint")
	}
	_, span := otel.Tracer("test").Start(context.Background(), "nothing")
	if span.IsRecording() {
		t.Fatal("a span records without an endpoint")
	}
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestTracingExportsToTheConfiguredEndpoint(t *testing.T) {
	tests := []struct {
		name     string
		flag     string // "{url}" is the collector's URL
		env      map[string]string
		wantPath string
	}{
		{"--otlp with no path exports to /v1/traces", "{url}", nil, "/v1/traces"},
		{"--otlp with a path exports to that path", "{url}/custom/traces", nil, "/custom/traces"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "", map[string]string{scaffold.EnvOTLPEndpoint: "{url}"}, "/v1/traces"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "", map[string]string{scaffold.EnvOTLPTracesEndpoint: "{url}/t"}, "/t"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newCollector(t)
			expand := func(s string) string {
				if len(s) >= 5 && s[:5] == "{url}" {
					return c.URL + s[5:]
				}
				return s
			}
			t.Setenv(scaffold.EnvOTLPEndpoint, "")
			t.Setenv(scaffold.EnvOTLPTracesEndpoint, "")
			for k, v := range tc.env {
				t.Setenv(k, expand(v))
			}
			resetGlobal(t)
			shutdown, err := scaffold.Tracing(context.Background(), expand(tc.flag), "tollgate-test", pipelinetest.Logger())
			if err != nil {
				t.Fatal(err)
			}
			_, span := otel.Tracer("test").Start(context.Background(), "exported")
			span.End()
			if c.exports(tc.wantPath) != 0 {
				t.Fatal("exported before the flush: the spans are not batched")
			}
			if err := shutdown(context.Background()); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			if got := c.exports(tc.wantPath); got != 1 {
				t.Fatalf("%d exports to %s, want 1 at shutdown (got %v)", got, tc.wantPath, c.paths)
			}
		})
	}
}

func TestTracingRefusesAnEndpointThatIsNotAURL(t *testing.T) {
	resetGlobal(t)
	for _, bad := range []string{"127.0.0.1:4318", "ftp://127.0.0.1:4318", "http://"} {
		if _, err := scaffold.Tracing(context.Background(), bad, "tollgate-test", pipelinetest.Logger()); err == nil {
			t.Errorf("--otlp %q accepted", bad)
		}
	}
}
