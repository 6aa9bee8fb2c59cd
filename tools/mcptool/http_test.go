package mcptool_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/tools/mcptool"
)

// recorder is an HTTP middleware that records the Authorization header of
// every request and answers a tools/call of the tool "boom" with HTTP 500.
type recorder struct {
	next http.Handler

	mu    sync.Mutex
	auths []string
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.auths = append(rec.auths, r.Header.Get("Authorization"))
	rec.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if bytes.Contains(body, []byte(`"tools/call"`)) && bytes.Contains(body, []byte(`"name":"boom"`)) {
		http.Error(w, "boom", http.StatusInternalServerError)
		return
	}
	rec.next.ServeHTTP(w, r)
}

func (rec *recorder) Auths() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.auths...)
}

type addArgs struct {
	A int `json:"a"`
	B int `json:"b"`
}

// httpServer is an MCP server over streamable HTTP, on loopback, built
// with the Go SDK.
func httpServer(t *testing.T) (*mcp.Server, *httptest.Server, *recorder) {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "mcptest-http", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "add"}, func(_ context.Context, _ *mcp.CallToolRequest, a addArgs) (*mcp.CallToolResult, any, error) {
		return textResult(fmt.Sprint(a.A + a.B)), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "boom"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return textResult("never reached"), nil, nil
	})
	rec := &recorder{next: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)}
	ts := httptest.NewServer(rec)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	return srv, ts, rec
}

// loadConfig writes a tools file and loads it.
func loadConfig(t *testing.T, text string) *mcptool.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tools.json")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := mcptool.LoadConfig(path)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	return cfg
}

func TestStreamableHTTPServer(t *testing.T) {
	t.Setenv("MCPTEST_TOKEN", "s3cret")
	srv, ts, rec := httpServer(t)
	cfg := loadConfig(t, `{"mcp_servers": {"h": {"url": "`+ts.URL+`", "headers": {"Authorization": "Bearer ${MCPTEST_TOKEN}"}}}}`)
	p := mcptool.New(cfg, fast())
	run(t, p)

	add := waitTool(t, p, "h.add")
	if out, err := call(t, context.Background(), add, `{"a":2,"b":3}`); err != nil || out != "5" {
		t.Fatalf("h.add: %q (%v), want 5", out, err)
	}
	auths := rec.Auths()
	for i, a := range auths {
		if a != "Bearer s3cret" {
			t.Fatalf("request %d of %d carried Authorization %q, want the configured header with the variable from the environment", i, len(auths), a)
		}
	}

	// The server notifies a change: the new tool is listed.
	mcp.AddTool(srv, &mcp.Tool{Name: "late"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return textResult("here"), nil, nil
	})
	if out, err := call(t, context.Background(), waitTool(t, p, "h.late"), "{}"); err != nil || out != "here" {
		t.Fatalf("h.late: %q (%v)", out, err)
	}

	_, err := call(t, context.Background(), waitTool(t, p, "h.boom"), "{}")
	wantKind(t, err, "uncertain:EXECUTION_UNCERTAIN") // an HTTP 500 after the request reached the server

	ts.CloseClientConnections()
	ts.Close()
	_, err = call(t, context.Background(), add, `{"a":1,"b":1}`)
	wantKind(t, err, "unavailable") // nothing listens any more
}

func TestHTTPHeadersDoNotFollowARedirect(t *testing.T) {
	t.Setenv("MCPTEST_TOKEN", "s3cret")
	_, elsewhere, rec := httpServer(t)
	redirect := httptest.NewServer(http.RedirectHandler(elsewhere.URL, http.StatusTemporaryRedirect))
	t.Cleanup(redirect.Close)
	cfg := loadConfig(t, `{"mcp_servers": {"r": {"url": "`+redirect.URL+`", "headers": {"Authorization": "Bearer ${MCPTEST_TOKEN}"}}}}`)
	p := mcptool.New(cfg, fast())
	if ts := toolsByName(t, p); len(ts) != 0 { // the start-up listing, done when Tools returns
		t.Fatalf("tools %v from a server that redirects, want none", ts)
	}
	if auths := rec.Auths(); len(auths) != 0 {
		t.Fatalf("the redirect target got %d requests (Authorization %q), want none", len(auths), auths)
	}
}
