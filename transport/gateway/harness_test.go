package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// gw is a running pipeline with the real gateway HTTP server on a loopback
// port in front of it.
type gw struct {
	*pipelinetest.H
	t      *testing.T
	s      *Server
	url    string
	tokens map[string]string // key name -> token
}

// testKeys are the keys every test gateway has, by name.
func testKeys(now time.Time) (map[string]string, []Key) {
	all := []Scope{ScopeSubmit, ScopeRead, ScopeDecide}
	spec := []struct {
		name, transport string
		scopes          []Scope
		vouch           bool
		notAfter        time.Time
	}{
		{"a", "gateway", all, true, time.Time{}},
		{"a2", "gateway", all, true, now.Add(time.Hour)}, // a rotated key of the same transport
		{"b", "other", all, true, time.Time{}},
		{"expired", "gateway", all, true, now.Add(-time.Second)},
		{"readonly", "gateway", []Scope{ScopeRead}, true, time.Time{}},
		{"novouch", "gateway", all, false, time.Time{}},
	}
	tokens := map[string]string{}
	var keys []Key
	for _, s := range spec {
		tok, k := NewKey(s.transport, s.scopes, s.vouch)
		k.NotAfter = s.notAfter
		tokens[s.name] = tok
		keys = append(keys, k)
	}
	return tokens, keys
}

// startGateway starts the pipeline (o) and the gateway (cfg adjusts its
// Config) behind a contract-checking recorder (contract_test.go).
func startGateway(t *testing.T, o pipelinetest.Options, cfg func(*Config)) *gw {
	t.Helper()
	h := pipelinetest.Start(t, o)
	tokens, keys := testKeys(time.Now())
	c := Config{JS: h.JS, Policy: h.Policy, Keys: keys, Logger: pipelinetest.Logger(), SubmitWait: 5 * time.Second, DecisionWait: 10 * time.Second}
	if cfg != nil {
		cfg(&c)
	}
	s, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(checkContract(t, s.Handler()))
	t.Cleanup(srv.Close)
	return &gw{H: h, t: t, s: s, url: srv.URL, tokens: tokens}
}

// do sends a request with key name's token ("" for none) and body (a
// []byte is sent as is, anything else as JSON); hdr are name, value pairs.
func (g *gw) do(method, path, key string, body any, hdr ...string) (*http.Response, []byte) {
	g.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			g.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, g.url+path, rd)
	if err != nil {
		g.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+g.tokens[key])
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp, data
}

// want checks resp's status and returns its body decoded as T.
func want[T any](t *testing.T, resp *http.Response, body []byte, status int) T {
	t.Helper()
	var v T
	if resp.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d: %s", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, status, body)
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return v
}

// wantProblem checks that resp is a problem with status and code.
func wantProblem(t *testing.T, resp *http.Response, body []byte, status int, code schemas.Code) Problem {
	t.Helper()
	p := want[Problem](t, resp, body, status)
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("content type %q, want application/problem+json", ct)
	}
	if p.Code != code || p.Status != status {
		t.Fatalf("problem %+v, want status %d code %s", p, status, code)
	}
	return p
}

func submitBody(session, sender string, calls ...CallIn) SubmitRequest {
	return SubmitRequest{SessionID: session, Sender: SenderIn{ID: sender}, Text: "please", Calls: calls}
}

func call(tool, args string) CallIn { return CallIn{Tool: tool, Args: json.RawMessage(args)} }

// submit posts a turn with key name and returns the response body.
func (g *gw) submit(key string, req SubmitRequest, hdr ...string) SubmitResponse {
	g.t.Helper()
	resp, body := g.do("POST", "/v1/turns", key, req, hdr...)
	return want[SubmitResponse](g.t, resp, body, http.StatusAccepted)
}

// count is how many messages stream holds on filter.
func (g *gw) count(stream, filter string) int {
	g.t.Helper()
	return len(g.Messages(stream, filter))
}

// sseReader reads Server-Sent Events from an open response.
type sseReader struct {
	resp  *http.Response
	lines chan string
	once  sync.Once
}

// sseEvent is one event read.
type sseEvent struct {
	id, kind, data string
}

// openSSE opens path as key with extra headers and checks the stream
// started.
func (g *gw) openSSE(path, key string, hdr ...string) *sseReader {
	g.t.Helper()
	req, err := http.NewRequest("GET", g.url+path, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+g.tokens[key])
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		g.t.Fatalf("GET %s: %d %s: %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	r := &sseReader{resp: resp, lines: make(chan string, 1024)}
	go func() {
		defer close(r.lines)
		buf := make([]byte, 0, 4096)
		tmp := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(tmp)
			buf = append(buf, tmp[:n]...)
			for {
				i := bytes.IndexByte(buf, '\n')
				if i < 0 {
					break
				}
				r.lines <- string(buf[:i])
				buf = buf[i+1:]
			}
			if err != nil {
				return
			}
		}
	}()
	g.t.Cleanup(r.close)
	return r
}

func (r *sseReader) close() { r.once.Do(func() { r.resp.Body.Close() }) }

// next returns the next event, or fails t after d. Comment lines are
// returned as events of kind ":" with the comment as data.
func (r *sseReader) next(t *testing.T, d time.Duration) sseEvent {
	t.Helper()
	var ev sseEvent
	d = jstest.Scale(d)
	timeout := time.After(d)
	for {
		select {
		case <-timeout:
			t.Fatalf("no SSE event within %v", d)
		case line, ok := <-r.lines:
			if !ok {
				t.Fatal("SSE stream ended")
			}
			switch {
			case strings.HasPrefix(line, ":"):
				return sseEvent{kind: ":", data: strings.TrimSpace(line[1:])}
			case strings.HasPrefix(line, "id: "):
				ev.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.kind = line[7:]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[6:]
			case line == "" && ev.kind != "":
				return ev
			}
		}
	}
}

// nextEvent is next, skipping comments.
func (r *sseReader) nextEvent(t *testing.T, d time.Duration) sseEvent {
	t.Helper()
	for {
		if ev := r.next(t, d); ev.kind != ":" {
			return ev
		}
	}
}
