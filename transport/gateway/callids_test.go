package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// callIDPolicy: echo and every Claude Code tool run at once.
const callIDPolicy = `{
  "version": "callids-test",
  "default_approval": "required",
  "approvers": ["cli:alice"],
  "tools": {
    "echo":     {"approval": "never"},
    "claude.*": {"approval": "never"}
  }
}`

// post sends body as JSON to path with key name's token and headers hdr
// (name, value pairs), and returns the status and body.
func (g *mcpGW) post(key, path string, body any, hdr ...string) (int, []byte) {
	g.t.Helper()
	b, _ := json.Marshal(body)
	r, _ := http.NewRequest("POST", "http://"+g.addr+path, bytes.NewReader(b))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+g.tokens[key])
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := g.tr.RoundTrip(r)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// TestOneKeysCallsAreItsOwn: keys a and a2 of one transport. a2 tries,
// through POST /v1/turns, to take what a's MCP and hook calls derive: a
// turn in a's sessions, a turn sent as a, and the message ids a's next MCP
// call and hook call will use, as Idempotency-Keys. Each session and
// sender is refused with its code and publishes nothing; the planted
// Idempotency-Keys make turns of a2's own. a's MCP call and hook call then
// run as their own turns (the ids a derived, requester a), neither joined
// to a2's turns nor refused IDEMPOTENCY_KEY_REUSED. a2's hook with a's
// Claude Code session and tool use id is a turn of a2's own session.
func TestOneKeysCallsAreItsOwn(t *testing.T) {
	g := startHooksOn(t, pipelinetest.Options{Env: jstest.Start(t), Policy: callIDPolicy}, "claude.bash")
	a, a2 := keyID(t, g.tokens["a"]), keyID(t, g.tokens["a2"])
	echo := `{"text":"mine"}`
	turn := func(session, sender string) SubmitRequest {
		return SubmitRequest{SessionID: session, Sender: SenderIn{ID: sender}, Calls: []CallIn{call("echo", `{"text":"planted"}`)}}
	}
	before := g.inboundCount()
	for _, tc := range []struct {
		name string
		req  SubmitRequest
		code schemas.Code
	}{
		{"a's MCP session", turn("mcp:"+a, "mallory"), CodeSessionReserved},
		{"a's MCP session with a client session", turn("mcp:"+a+":work", "mallory"), CodeSessionReserved},
		{"a's hook session", turn("claude:"+a+":sess-1", "mallory"), CodeSessionReserved},
		{"a hook session naming no key", turn("claude:sess-1", "mallory"), CodeSessionReserved},
		{"an MCP session naming no key", turn("mcp:", "mallory"), CodeSessionReserved},
		{"a's key id as sender", turn("s-own", a), CodeSenderReserved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := g.post("a2", "/v1/turns", tc.req)
			var p Problem
			if err := json.Unmarshal(body, &p); err != nil || status != http.StatusForbidden || p.Code != tc.code {
				t.Fatalf("%d %s, want 403 %s", status, body, tc.code)
			}
		})
	}
	if n := g.inboundCount(); n != before {
		t.Fatalf("%d inbound messages published by refused requests", n-before)
	}
	// Its own reserved session, and its own id as sender, are a2's to use.
	if status, body := g.post("a2", "/v1/turns", turn("mcp:"+a2, a2)); status != http.StatusAccepted {
		t.Fatalf("a2 in its own MCP session: %d %s, want 202", status, body)
	}

	// The ids a's next calls derive, known to anyone who knows a's id.
	_, digest, _ := schemas.CanonicalArgs(echo)
	mcpID := callMessageID("mcp", callBase("mcp", "gateway", a, MCPSession(&Key{ID: a}, http.Header{}), "echo", digest), 0)
	hookSession := ClaudeSession(&Key{ID: a}, "sess-1")
	hookID := "hook-" + hashParts("hook", "gateway", a, hookSession, "toolu_victim")[:32]
	planted := map[string]string{}
	for _, id := range []string{mcpID, hookID} {
		status, body := g.post("a2", "/v1/turns", turn("s-plant", "mallory"), "Idempotency-Key", id)
		var sub SubmitResponse
		if err := json.Unmarshal(body, &sub); err != nil || status != http.StatusAccepted {
			t.Fatalf("a2 with Idempotency-Key %s: %d %s", id, status, body)
		}
		if sub.TurnID == schemas.TurnID("gateway", id) {
			t.Fatalf("a2's Idempotency-Key %s made the turn %s that a's call derives", id, sub.TurnID)
		}
		planted[id] = sub.TurnID
	}

	ctx, cancel := context.WithTimeout(context.Background(), pipelinetest.Wait)
	defer cancel()
	res, err := g.client("a", nil).CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "mine"}})
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := res.Meta["tollgate"].(map[string]any)
	if res.IsError || text(res) != "mine" || meta["turn_id"] != schemas.TurnID("gateway", mcpID) {
		t.Fatalf("a's MCP call: %s %v, want its own turn %s with output mine", text(res), meta, schemas.TurnID("gateway", mcpID))
	}
	if b := g.Batch(schemas.TurnID("gateway", mcpID)); b.Context.Requester.Principal != "gateway:"+a || b.Context.SessionID != "mcp:"+a {
		t.Fatalf("a's MCP turn sent by %s in %s, want gateway:%s in mcp:%s", b.Context.Requester.Principal, b.Context.SessionID, a, a)
	}

	d := g.hookUse("a", "", "sess-1", "Bash", `{"command":"ls"}`, "toolu_victim")
	if d.PermissionDecision != "allow" {
		t.Fatalf("a's hook: %+v, want allow", d)
	}
	if b := g.Batch(schemas.TurnID("gateway", hookID)); b.Context.Requester.Principal != "gateway:"+a || b.Context.SessionID != hookSession {
		t.Fatalf("a's hook turn sent by %s in %s, want gateway:%s in %s", b.Context.Requester.Principal, b.Context.SessionID, a, hookSession)
	}
	for id, turnID := range planted {
		if b := g.WaitBatch(turnID, "recorded", func(*schemas.BatchRecord) bool { return true }); b.Context.Requester.Principal != "gateway:mallory" {
			t.Errorf("a2's turn for %s sent by %s, want gateway:mallory", id, b.Context.Requester.Principal)
		}
	}

	// The same Claude Code session and tool use from a2: a2's own turn.
	if d := g.hookUse("a2", "", "sess-1", "Bash", `{"command":"ls"}`, "toolu_victim"); d.PermissionDecision != "allow" {
		t.Fatalf("a2's hook: %+v, want allow", d)
	}
	own := "hook-" + hashParts("hook", "gateway", a2, ClaudeSession(&Key{ID: a2}, "sess-1"), "toolu_victim")[:32]
	if b := g.Batch(schemas.TurnID("gateway", own)); b.Context.SessionID != fmt.Sprintf("claude:%s:sess-1", a2) {
		t.Fatalf("a2's hook turn in session %s, want its own", b.Context.SessionID)
	}
}
