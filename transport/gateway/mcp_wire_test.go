package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// The MCP wire, read raw: what the gateway writes on /mcp checked
// against what MCP says, with a client that is not go-sdk's.

// rawMCP is a JSON-RPC client of /mcp over streamable HTTP, written from
// the transport's spec: one POST per message, answers read from the POST's
// SSE stream (or JSON body).
type rawMCP struct {
	g       *mcpGW
	token   string
	session string // Mcp-Session-Id
	tg      string // Tollgate-Session: each raw client its own turns
}

var rawClients atomic.Int64

// rpcMsg is a JSON-RPC message as the client reads it.
type rpcMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
	raw    []byte
}

// post sends body (one JSON-RPC message) with token, on the client's
// session if it has one, and returns the answer's response once its
// headers arrive (a held call's may come late: go-sdk writes them with the
// first event) and the messages of the answer as they arrive; the channel
// closes when the answer ends.
func (c *rawMCP) post(t *testing.T, token, body string) (<-chan *http.Response, <-chan rpcMsg) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+c.g.addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if c.session != "" {
		req.Header.Set("Mcp-Session-Id", c.session)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	req.Header.Set(mcpSessionHeader, c.tg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req = req.WithContext(ctx)
	respC := make(chan *http.Response, 1)
	out := make(chan rpcMsg, 16)
	go func() {
		defer close(out)
		resp, err := c.g.tr.RoundTrip(req)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("POST %s: %v", body, err)
			}
			close(respC)
			return
		}
		defer resp.Body.Close()
		respC <- resp
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			b, _ := io.ReadAll(resp.Body)
			if m, ok := decodeRPC(b); ok {
				out <- m
			}
			return
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
				if m, ok := decodeRPC([]byte(strings.TrimSpace(data))); ok {
					out <- m
				}
			}
		}
	}()
	return respC, out
}

// response waits for the response of a post.
func response(t *testing.T, respC <-chan *http.Response) *http.Response {
	t.Helper()
	select {
	case r := <-respC:
		if r == nil {
			t.Fatal("no response")
		}
		return r
	case <-jstest.After(jstest.Wait):
		t.Fatal("no response")
	}
	return nil
}

func decodeRPC(b []byte) (rpcMsg, bool) {
	var m rpcMsg
	if json.Unmarshal(b, &m) != nil {
		return m, false
	}
	m.raw = b
	return m, true
}

// answer waits for the answer with id among msgs.
func answer(t *testing.T, msgs <-chan rpcMsg, id string) rpcMsg {
	t.Helper()
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("the stream ended without an answer to %s", id)
			}
			if string(m.ID) == id && m.Method == "" {
				return m
			}
		case <-jstest.After(jstest.Wait):
			t.Fatalf("no answer to %s", id)
		}
	}
}

// openRaw opens an MCP session (protocol 2025-11-25) with key name.
func (g *mcpGW) openRaw(t *testing.T, key string) *rawMCP {
	t.Helper()
	c := &rawMCP{g: g, token: g.tokens[key], tg: "raw-" + strconv.FormatInt(rawClients.Add(1), 10)}
	respC, msgs := c.post(t, c.token, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	resp := response(t, respC)
	if m := answer(t, msgs, "1"); m.Error != nil {
		t.Fatalf("initialize: %s", m.raw)
	}
	c.session = resp.Header.Get("Mcp-Session-Id")
	if c.session == "" {
		t.Fatal("initialize: no Mcp-Session-Id")
	}
	r, _ := c.post(t, c.token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if st := response(t, r).StatusCode; st != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d", st)
	}
	return c
}

// MCP: a receiver of notifications/cancelled should not answer the
// cancelled request. A held tools/call that its client cancels gets no
// answer on its stream, which ends; a cancellation sent with another key
// (the same transport's) neither cancels the call nor silences it.
func TestMCPDoesNotAnswerACancelledRequest(t *testing.T) {
	tl := &counter{}
	g := startMCP(t, tl)

	t.Run("a cancelled call gets no answer", func(t *testing.T) {
		c := g.openRaw(t, "a")
		_, call := c.post(t, c.token, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"counter","arguments":{"n":70}}}`)
		g.pendingFor("counter", `{"n":70}`) // the call is held
		r, _ := c.post(t, c.token, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"the user gave up"}}`)
		if st := response(t, r).StatusCode; st != http.StatusAccepted {
			t.Fatalf("notifications/cancelled: status %d", st)
		}
		// A later fact: the session answers a ping sent after the
		// cancellation...
		_, ping := c.post(t, c.token, `{"jsonrpc":"2.0","id":8,"method":"ping"}`)
		answer(t, ping, "8")
		// ...and the cancelled call's stream ends, without its answer.
		for {
			select {
			case m, ok := <-call:
				if !ok {
					return
				}
				if string(m.ID) == "7" {
					t.Fatalf("the cancelled request was answered: %s", m.raw)
				}
			case <-jstest.After(jstest.Wait):
				t.Fatal("the cancelled call's stream did not end")
			}
		}
	})

	t.Run("another key's cancellation neither cancels the call nor silences it", func(t *testing.T) {
		c := g.openRaw(t, "a")
		_, call := c.post(t, c.token, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"counter","arguments":{"n":71}}}`)
		id := g.pendingFor("counter", `{"n":71}`)
		r, _ := c.post(t, g.tokens["a2"], `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`)
		if st := response(t, r).StatusCode; st != http.StatusForbidden {
			t.Fatalf("another key's cancellation on the session: status %d, want 403", st)
		}
		g.For(t).Decide(id, "approve", "alice")
		m := answer(t, call, "7")
		var res mcp.CallToolResult
		if err := json.Unmarshal(m.Result, &res); err != nil || res.IsError || text(&res) == "" {
			t.Fatalf("the call's answer %s, want its result", m.raw)
		}
	})
}

// recordBodies keeps what a client reads of every response body, as it
// reads it (a GET's event stream never ends).
type recordBodies struct {
	next   http.RoundTripper
	mu     sync.Mutex
	bodies []*bytes.Buffer
}

func (r *recordBodies) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	buf := &bytes.Buffer{}
	r.mu.Lock()
	r.bodies = append(r.bodies, buf)
	r.mu.Unlock()
	resp.Body = teeBody{resp.Body, r, buf}
	return resp, nil
}

// teeBody copies what is read of a body into buf, under the recorder's
// lock.
type teeBody struct {
	io.ReadCloser
	r   *recordBodies
	buf *bytes.Buffer
}

func (b teeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.r.mu.Lock()
	b.buf.Write(p[:n])
	b.r.mu.Unlock()
	return n, err
}

// messages are the JSON-RPC messages of every body recorded.
func (r *recordBodies) messages() []rpcMsg {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []rpcMsg
	for _, buf := range r.bodies {
		b := buf.Bytes()
		if m, ok := decodeRPC(bytes.TrimSpace(b)); ok {
			out = append(out, m)
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if data, ok := strings.CutPrefix(line, "data:"); ok {
				if m, ok := decodeRPC([]byte(strings.TrimSpace(data))); ok {
					out = append(out, m)
				}
			}
		}
	}
	return out
}

// mcpSchema compiles the definition at JSON pointer ptr of the MCP schema
// of protocol version (testdata: schema/<version>/schema.json of
// github.com/modelcontextprotocol/modelcontextprotocol at commit
// b0f60ba5; 2026-07-28 is the newest go-sdk v1.8.0 speaks, 2025-11-25 the
// newest of the initialize handshake).
func mcpSchema(t *testing.T, version, ptr string) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open("testdata/mcp-schema-" + version + ".json")
	if err != nil {
		t.Fatalf("no MCP schema for protocol %s: %v", version, err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	url := "https://modelcontextprotocol.invalid/" + version + "/schema.json"
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(url + "#" + ptr)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validJSON fails unless raw is valid against s.
func validJSON(t *testing.T, s *jsonschema.Schema, what string, raw []byte) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := s.Validate(v); err != nil {
		t.Fatalf("%s does not match the MCP schema: %v\n%s", what, err, raw)
	}
}

// tools/list is answered by the gateway, not by go-sdk's list: its answer
// must still be what MCP says a tools/list answer is in the protocol the
// session speaks, and its cache fields (ttlMs, cacheScope), which go-sdk
// sends in every protocol, what the protocol that defines them
// (2026-07-28) allows: cacheScope "public" or "private", never "".
func TestMCPToolsListMatchesTheMCPSchema(t *testing.T) {
	g := startMCP(t, &counter{})
	rec := &recordBodies{next: bearer{g.tokens["a"], g.tr}}
	c := mcp.NewClient(&mcp.Implementation{Name: "schema-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: "http://" + g.addr + "/mcp", HTTPClient: &http.Client{Transport: rec}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	l, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Tools) == 0 {
		t.Fatal("no tools listed")
	}
	var lists []rpcMsg
	for _, m := range rec.messages() {
		var r struct {
			Tools json.RawMessage `json:"tools"`
		}
		if m.Result != nil && json.Unmarshal(m.Result, &r) == nil && r.Tools != nil {
			lists = append(lists, m)
		}
	}
	if len(lists) != 1 {
		t.Fatalf("%d tools/list answers on the wire, want 1", len(lists))
	}
	list := lists[0]
	version := cs.InitializeResult().ProtocolVersion
	t.Logf("protocol %s", version)
	if version >= "2026-07-28" {
		validJSON(t, mcpSchema(t, version, "/$defs/ListToolsResultResponse"), "the tools/list answer", list.raw)
	} else {
		validJSON(t, mcpSchema(t, version, "/$defs/JSONRPCResultResponse"), "the tools/list answer", list.raw)
		validJSON(t, mcpSchema(t, version, "/$defs/ListToolsResult"), "the tools/list result", list.Result)
	}
	var got struct {
		TTLMs      json.RawMessage `json:"ttlMs"`
		CacheScope json.RawMessage `json:"cacheScope"`
	}
	_ = json.Unmarshal(list.Result, &got)
	validJSON(t, mcpSchema(t, "2026-07-28", "/$defs/ListToolsResult/properties/ttlMs"), "ttlMs", got.TTLMs)
	validJSON(t, mcpSchema(t, "2026-07-28", "/$defs/ListToolsResult/properties/cacheScope"), "cacheScope", got.CacheScope)
	if string(got.TTLMs) != "0" || string(got.CacheScope) != `"private"` {
		t.Fatalf("ttlMs %s cacheScope %s, want 0 (read anew each time) and \"private\" (an answer to a key)", got.TTLMs, got.CacheScope)
	}
}
