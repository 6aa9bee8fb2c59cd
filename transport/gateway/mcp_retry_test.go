package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// droppable is an MCP client connection whose TCP connections a test can
// cut, as a crashed client or a lost network would: no cancellation
// reaches the server.
type droppable struct {
	cs    *mcp.ClientSession
	mu    sync.Mutex
	conns []net.Conn
}

// drop closes every TCP connection the client opened.
func (d *droppable) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
}

// sessionClient connects an MCP client with key name's token that sends
// Tollgate-Session: session on every request, over its own TCP
// connections, to the gateway at addr.
func (g *mcpGW) sessionClient(addr, key, session string) *droppable {
	g.t.Helper()
	d := &droppable{}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			d.mu.Lock()
			d.conns = append(d.conns, c)
			d.mu.Unlock()
		}
		return c, err
	}}
	g.t.Cleanup(tr.CloseIdleConnections)
	c := mcp.NewClient(&mcp.Implementation{Name: "gateway-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: "http://" + addr + "/mcp", MaxRetries: -1,
		HTTPClient: &http.Client{Transport: headers{tr, []string{"Authorization", "Bearer " + g.tokens[key], mcpSessionHeader, session}}},
	}, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { _ = cs.Close() })
	d.cs = cs
	return d
}

// headers sets name, value pairs on every request.
type headers struct {
	next http.RoundTripper
	kv   []string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for i := 0; i+1 < len(h.kv); i += 2 {
		r.Header.Set(h.kv[i], h.kv[i+1])
	}
	return h.next.RoundTrip(r)
}

// oneResult waits for a call's result, failing as soon as a second
// approval is requested for tool with args.
func (g *mcpGW) oneResult(done <-chan callDone, tool, args string) *mcp.CallToolResult {
	g.t.Helper()
	var res *mcp.CallToolResult
	jstest.EventuallyState(g.t, jstest.Wait, "the call's result", func() (bool, string) {
		select {
		case d := <-done:
			if d.err != nil {
				g.t.Fatalf("call: %v", d.err)
			}
			res = d.res
			return true, ""
		default:
		}
		n := g.requested(tool, args)
		if n > 1 {
			g.t.Fatalf("the call asked again: %d approvals requested for %s %s", n, tool, args)
		}
		return false, fmt.Sprintf("no result, %d approval(s) requested for %s %s", n, tool, args)
	})
	return res
}

// replica starts another gateway on the same NATS server, with its own
// clock, and returns its address.
func (g *mcpGW) replica(now func() time.Time) string {
	g.t.Helper()
	s, err := New(Config{JS: g.JS, Policy: g.Policy, Keys: g.keys, Logger: pipelinetest.Logger(), Now: now})
	if err != nil {
		g.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- s.Serve(ctx, ln) }()
	g.t.Cleanup(func() {
		cancel()
		<-stopped
	})
	return ln.Addr().String()
}

// A gated call whose client vanished (its connection cut, nothing
// cancelled) and that is approved meanwhile, called again with the same
// Tollgate-Session, tool and arguments from a new MCP connection, returns
// the one result: one approval, one run.
func TestMCPRetryOnANewConnectionRunsTheToolOnce(t *testing.T) {
	tl := &counter{}
	g := startMCP(t, tl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*pipelinetest.Wait)
	defer cancel()

	first := g.sessionClient(g.addr, "a", "work")
	done := callAsync(ctx, first.cs, "counter", map[string]any{"n": 11})
	id := g.pendingFor("counter", `{"n":11}`)
	first.drop()
	g.Decide(id, "approve", "alice")
	g.WaitTerminal(schemas.TurnIDOfApproval(id))
	<-done // the cut connection's call ends on the client; the gateway's handler may go on

	for i := range 3 {
		r := g.oneResult(callAsync(ctx, g.sessionClient(g.addr, "a", "work").cs, "counter", map[string]any{"n": 11}), "counter", `{"n":11}`)
		if r.IsError || text(r) != "ran 1" || turnOf(t, r) != schemas.TurnIDOfApproval(id) {
			t.Fatalf("call %d again: error %v, %q, turn %s; want the one result of turn %s", i+1, r.IsError, text(r), turnOf(t, r), schemas.TurnIDOfApproval(id))
		}
	}
	if n := tl.runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}
	if n := g.requested("counter", `{"n":11}`); n != 1 {
		t.Fatalf("%d approvals requested, want 1", n)
	}
	t.Run("another session's identical call is its own call", func(t *testing.T) {
		done := callAsync(ctx, g.sessionClient(g.addr, "a", "other").cs, "counter", map[string]any{"n": 11})
		jstest.EventuallyState(t, jstest.Wait, "a second approval, for the other session's call", func() (bool, string) {
			n := g.requested("counter", `{"n":11}`)
			return n == 2, fmt.Sprintf("%d approval(s) requested", n)
		})
		select {
		case d := <-done:
			t.Fatalf("the other session's call returned before anyone decided: %+v %v", d.res, d.err)
		default:
		}
	})
}

// The rule holds across gateway replicas and restarts: what decides is
// the turn in KV, not a gateway's memory. A call whose result was returned
// by one replica, called again on another, on the first, and on a
// restarted gateway, returns the one result; once the pickup window has
// passed, the identical call is a new one that asks again.
func TestMCPRetryAcrossReplicasAndRestarts(t *testing.T) {
	tl := &counter{}
	g := startMCP(t, tl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*pipelinetest.Wait)
	defer cancel()
	b := g.replica(time.Now)

	first := g.sessionClient(g.addr, "a", "ops")
	done := callAsync(ctx, first.cs, "counter", map[string]any{"n": 12})
	id := g.pendingFor("counter", `{"n":12}`)
	turn := schemas.TurnIDOfApproval(id)
	first.drop()
	g.Decide(id, "approve", "alice")
	g.WaitTerminal(turn)
	<-done

	call := func(addr, what string) *mcp.CallToolResult {
		t.Helper()
		r := g.oneResult(callAsync(ctx, g.sessionClient(addr, "a", "ops").cs, "counter", map[string]any{"n": 12}), "counter", `{"n":12}`)
		if r.IsError || text(r) != "ran 1" || turnOf(t, r) != turn {
			t.Fatalf("%s: error %v, %q, turn %s; want the one result of turn %s", what, r.IsError, text(r), turnOf(t, r), turn)
		}
		return r
	}
	call(b, "on another replica")
	call(g.addr, "on the first gateway, after the other returned the result")
	g.halt()
	g.serve()
	call(g.addr, "on the restarted gateway")
	if n := tl.runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want 1", n)
	}

	later := g.replica(func() time.Time { return time.Now().Add(pickupWindow + time.Minute) })
	done = callAsync(ctx, g.sessionClient(later, "a", "ops").cs, "counter", map[string]any{"n": 12})
	jstest.EventuallyState(t, jstest.Wait, "after the pickup window the identical call asks again", func() (bool, string) {
		n := g.requested("counter", `{"n":12}`)
		return n == 2, fmt.Sprintf("%d approval(s) requested", n)
	})
	select {
	case d := <-done:
		t.Fatalf("after the pickup window the call returned before anyone decided: %+v %v", d.res, d.err)
	default:
	}
}

// The same with the official TypeScript client: a client process killed
// while its gated call waits (a real dropped connection), the call
// approved meanwhile, and the same call made by a new process in the same
// Tollgate-Session gets the one result of the one run.
func TestMCPRetryFromANewTypeScriptClientProcessRunsTheToolOnce(t *testing.T) {
	node, script := tsClient(t)
	tl := &counter{}
	g := startMCP(t, tl)
	ctx, cancel := context.WithTimeout(context.Background(), 2*pipelinetest.Wait)
	defer cancel()
	args := []string{script, "http://" + g.addr + "/mcp", g.tokens["a"], "counter", `{"n":13}`, "ts-work"}

	first := exec.CommandContext(ctx, node, args...)
	first.Stderr = os.Stderr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	id := g.pendingFor("counter", `{"n":13}`)
	_ = first.Process.Kill()
	_ = first.Wait()
	g.Decide(id, "approve", "alice")
	g.WaitTerminal(schemas.TurnIDOfApproval(id))

	var out bytes.Buffer
	again := exec.CommandContext(ctx, node, args...)
	again.Stdout, again.Stderr = &out, os.Stderr
	if err := again.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- again.Wait() }()
	jstest.EventuallyState(t, jstest.Wait, "the new process gets the result and exits", func() (bool, string) {
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("node: %v: %s", err, out.Bytes())
			}
			return true, ""
		default:
		}
		n := g.requested("counter", `{"n":13}`)
		if n > 1 {
			t.Fatalf("the new process's call asked again: %d approvals requested", n)
		}
		return false, fmt.Sprintf("running, %d approval(s) requested", n)
	})
	ranOnce(t, tl, out.Bytes())
}
