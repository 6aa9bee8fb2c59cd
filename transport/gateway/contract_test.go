package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The contract test: every response any test of this package sees goes
// through checkContract, which fails the test unless the document
// (openapi.json) lists the route, the method, the status and the content
// type, and the body validates against the documented schema.

const docURL = "https://tollgate.invalid/openapi.json"

var contract struct {
	once     sync.Once
	doc      map[string]any
	compiler *jsonschema.Compiler
	mu       sync.Mutex
	schemas  map[string]*jsonschema.Schema
	err      error
}

func loadContract(t *testing.T) {
	t.Helper()
	contract.once.Do(func() {
		if contract.err = json.Unmarshal(openAPI, &contract.doc); contract.err != nil {
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(openAPI))
		if err != nil {
			contract.err = err
			return
		}
		contract.compiler = jsonschema.NewCompiler()
		contract.err = contract.compiler.AddResource(docURL, doc)
		contract.schemas = map[string]*jsonschema.Schema{}
	})
	if contract.err != nil {
		t.Fatalf("openapi.json: %v", contract.err)
	}
}

// pointer escapes a JSON pointer token.
func pointer(tok string) string {
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
}

// documented checks a response against the document and returns what is
// wrong, or "".
func documented(pattern string, status int, contentType string, body []byte) string {
	method, path, _ := strings.Cut(pattern, " ")
	method = strings.ToLower(method)
	paths, _ := contract.doc["paths"].(map[string]any)
	op, _ := paths[path].(map[string]any)
	opm, _ := op[method].(map[string]any)
	if opm == nil {
		return fmt.Sprintf("route %q is not in openapi.json", pattern)
	}
	responses, _ := opm["responses"].(map[string]any)
	code := strconv.Itoa(status)
	resp, _ := responses[code].(map[string]any)
	if resp == nil {
		return fmt.Sprintf("%s: status %d is not documented", pattern, status)
	}
	loc := "#/paths/" + pointer(path) + "/" + method + "/responses/" + code
	if ref, ok := resp["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/responses/")
		resp = contract.doc["components"].(map[string]any)["responses"].(map[string]any)[name].(map[string]any)
		loc = "#/components/responses/" + pointer(name)
	}
	ct, _, _ := strings.Cut(contentType, ";")
	content, _ := resp["content"].(map[string]any)
	if _, ok := content[ct]; !ok {
		return fmt.Sprintf("%s %d: content type %q is not documented", pattern, status, ct)
	}
	if ct == "text/event-stream" {
		return ""
	}
	loc += "/content/" + pointer(ct) + "/schema"
	if msg := validateAt(loc, body); msg != "" {
		return fmt.Sprintf("%s %d: body %s", pattern, status, msg)
	}
	return ""
}

// documentedRequest checks the JSON body of a request the server
// accepted (answered 2xx) against the operation's documented request
// body, and returns what is wrong, or "": a client written from the
// document can send every request the server takes.
func documentedRequest(pattern string, body []byte) string {
	method, path, _ := strings.Cut(pattern, " ")
	method = strings.ToLower(method)
	loc := "#/paths/" + pointer(path) + "/" + method + "/requestBody/content/application~1json/schema"
	paths, _ := contract.doc["paths"].(map[string]any)
	op, _ := paths[path].(map[string]any)
	opm, _ := op[method].(map[string]any)
	if opm["requestBody"] == nil || len(body) == 0 {
		return ""
	}
	if msg := validateAt(loc, body); msg != "" {
		return fmt.Sprintf("%s: request body %s", pattern, msg)
	}
	return ""
}

// validateAt validates the JSON document body against the schema at loc
// in the document, and returns what is wrong, or "".
func validateAt(loc string, body []byte) string {
	contract.mu.Lock()
	sch := contract.schemas[loc]
	var err error
	if sch == nil {
		sch, err = contract.compiler.Compile(docURL + loc)
		contract.schemas[loc] = sch
	}
	contract.mu.Unlock()
	if err != nil {
		return fmt.Sprintf("%s: %v", loc, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Sprintf("is not JSON: %v", err)
	}
	if err := sch.Validate(v); err != nil {
		return fmt.Sprintf("does not match the document: %v\n%s", err, body)
	}
	return ""
}

// recorder keeps the status and body of a response as it is written.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if !strings.HasPrefix(r.Header().Get("Content-Type"), "text/event-stream") {
		r.body.Write(b)
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() { r.ResponseWriter.(http.Flusher).Flush() }

func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(r.ResponseWriter).Hijack()
}

// checkContract wraps h so that every response is checked against the
// document (documented); a mismatch fails t.
func checkContract(t *testing.T, h http.Handler) http.Handler {
	loadContract(t)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w}
		var req []byte
		if r.Body != nil && !strings.HasPrefix(r.URL.Path, "/mcp") {
			req, _ = io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(req))
		}
		h.ServeHTTP(rec, r)
		if strings.HasPrefix(r.URL.Path, "/mcp") {
			return // MCP is described by its own protocol, not by OpenAPI
		}
		if msg := documented(r.Pattern, rec.status, rec.Header().Get("Content-Type"), rec.body.Bytes()); msg != "" {
			t.Errorf("contract: %s %s: %s", r.Method, r.URL, msg)
		}
		// A hook answers 200 to any input (a deny names what was wrong).
		if rec.status/100 == 2 && !slices.Contains(hookRoutes, r.Pattern) {
			if msg := documentedRequest(r.Pattern, req); msg != "" {
				t.Errorf("contract: %s %s: %s", r.Method, r.URL, msg)
			}
		}
	})
}

// hookRoutes are the /v1 routes registered through routeHooks (hooks.go);
// /mcp is not an OpenAPI route.
var hookRoutes = []string{"POST /v1/hooks/pretooluse"}

// TestOpenAPIDocumentsEveryRoute: the document's operations are exactly
// the routes the server registers, and each names its security.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	loadContract(t)
	var registered, doc []string
	var s Server
	for _, rt := range s.apiRoutes() {
		registered = append(registered, rt.pattern)
	}
	registered = append(registered, hookRoutes...)
	for path, ops := range contract.doc["paths"].(map[string]any) {
		for method, op := range ops.(map[string]any) {
			doc = append(doc, strings.ToUpper(method)+" "+path)
			sec, hasSec := op.(map[string]any)["security"]
			open := hasSec && len(sec.([]any)) == 0
			if want := path == "/healthz" || path == "/v1/openapi.json"; open != want {
				t.Errorf("%s %s: open to all = %v, want %v", method, path, open, want)
			}
		}
	}
	slices.Sort(registered)
	slices.Sort(doc)
	if !slices.Equal(registered, doc) {
		t.Errorf("routes %v\ndocument %v", registered, doc)
	}
	if v, _ := contract.doc["openapi"].(string); v != "3.1.0" {
		t.Errorf("openapi %q, want 3.1.0", v)
	}
}

// TestOpenRoutesAndTheDocumentIsServed: /healthz and /v1/openapi.json need
// no key and the served document is the one in the repository; every
// other route refuses a request without a key.
func TestOpenRoutesAndTheDocumentIsServed(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{Stages: []string{}}, nil)
	resp, body := g.do("GET", "/healthz", "", nil)
	if h := want[map[string]string](t, resp, body, http.StatusOK); h["status"] != "ok" {
		t.Errorf("health %v", h)
	}
	resp, body = g.do("GET", "/v1/openapi.json", "", nil)
	want[map[string]any](t, resp, body, http.StatusOK)
	if !bytes.Equal(body, openAPI) {
		t.Error("served document differs from openapi.json")
	}
	// The hook's answer has its documented shape too (checkContract).
	resp, body = g.do("POST", "/v1/hooks/pretooluse", "a", []byte(`{"tool_name":`))
	if out := want[HookOutput](t, resp, body, http.StatusOK); out.HookSpecificOutput.PermissionDecision != "deny" ||
		!strings.HasPrefix(out.HookSpecificOutput.PermissionDecisionReason, string(schemas.CodeMalformed)) {
		t.Errorf("hook with a malformed body: %+v, want deny MALFORMED_PAYLOAD", out)
	}
	keyed := slices.Clone(hookRoutes)
	for _, rt := range g.s.apiRoutes() {
		if rt.scope != "" {
			keyed = append(keyed, rt.pattern)
		}
	}
	for _, pattern := range keyed {
		method, path, _ := strings.Cut(pattern, " ")
		path = strings.ReplaceAll(path, "{id}", "t-0123456789abcdef0123")
		t.Run(pattern, func(t *testing.T) {
			resp, body := g.do(method, path, "", nil)
			wantProblem(t, resp, body, http.StatusUnauthorized, CodeUnauthenticated)
		})
	}
}
