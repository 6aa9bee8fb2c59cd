package mcptool_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/tools/mcptool"
)

// The test binary doubles as the stdio MCP servers of the tests: run with
// MCPTEST_MODE set, it serves that mode on its stdin and stdout instead of
// running tests.
//
//   - "tools": a Go SDK server with the tools the tests call;
//   - "garbage": a hand-written server that lists tools properly but
//     answers some calls with something that is not a valid reply;
//   - "preview": the tools of the preview test (preview_test.go);
//   - "crash": exits at once.
//
// MCPTEST_STARTS names a file to which every start appends
// "<pid> <unix nanoseconds>".
func TestMain(m *testing.M) {
	if mode := os.Getenv("MCPTEST_MODE"); mode != "" {
		os.Exit(serve(mode))
	}
	os.Exit(m.Run())
}

func serve(mode string) int {
	if path := os.Getenv("MCPTEST_STARTS"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return 2
		}
		fmt.Fprintf(f, "%d %d\n", os.Getpid(), time.Now().UnixNano())
		f.Close()
	}
	switch mode {
	case "tools":
		if err := toolsServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		return 0
	case "garbage":
		garbageServer()
		return 0
	case "preview": // preview_test.go
		s := mcp.NewServer(&mcp.Implementation{Name: "mcptest-preview", Version: "1"}, nil)
		addPreviewTools(s)
		if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		return 0
	default: // "crash"
		fmt.Fprintln(os.Stderr, "crashing at start")
		return 1
	}
}

type textArgs struct {
	Text string `json:"text"`
}

type nameArgs struct {
	Name string `json:"name"`
}

func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// toolsServer has the tools of the stdio tests.
func toolsServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcptest", Version: "1"}, nil)
	yes := true
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Returns its text.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, a textArgs) (*mcp.CallToolResult, any, error) {
			return textResult(a.Text), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Annotations: &mcp.ToolAnnotations{DestructiveHint: &yes}},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			r := textResult("disk full")
			r.IsError = true
			return r, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "env"}, func(_ context.Context, _ *mcp.CallToolRequest, a nameArgs) (*mcp.CallToolResult, any, error) {
		v, ok := os.LookupEnv(a.Name)
		if !ok {
			v = "<unset>"
		}
		return textResult(v), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "meta"}, func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		return textResult(fmt.Sprint(req.Params.Meta[mcptool.CallIDMeta])), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "traceparent"}, func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		return textResult(fmt.Sprint(req.Params.Meta["traceparent"])), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "media"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "a"},
			&mcp.ImageContent{MIMEType: "image/png", Data: []byte{1, 2, 3}},
			&mcp.ResourceLink{URI: "file:///x", Name: "x"},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///y", Text: "body"}},
		}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "hang"}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		<-ctx.Done()
		return nil, nil, ctx.Err()
	})
	mcp.AddTool(s, &mcp.Tool{Name: "exit"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		os.Exit(3)
		return nil, nil, nil
	})
	// Names Tollgate must sanitize or refuse.
	for _, name := range []string{"Fetch URL", "dup", "DUP", strings.Repeat("x", 70)} {
		mcp.AddTool(s, &mcp.Tool{Name: name}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			return textResult(name), nil, nil
		})
	}
	return s
}

// garbageServer speaks just enough JSON-RPC by hand to be listed, then
// answers tools/call "noise" with a line that is not JSON, "badresult"
// with a result that is not a tool result, and "ok" properly.
func garbageServer() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 0, 64<<10), 1<<20)
	out := json.NewEncoder(os.Stdout)
	reply := func(id json.RawMessage, key string, v any) {
		_ = out.Encode(map[string]any{"jsonrpc": "2.0", "id": id, key: v})
	}
	object := map[string]any{"type": "object"}
	for in.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if json.Unmarshal(in.Bytes(), &req) != nil || req.ID == nil {
			continue // notifications
		}
		switch {
		case req.Method == "initialize":
			reply(req.ID, "result", map[string]any{
				"protocolVersion": "2025-06-18", "capabilities": map[string]any{"tools": map[string]any{}},
				"serverInfo": map[string]any{"name": "garbage", "version": "1"},
			})
		case req.Method == "tools/list":
			reply(req.ID, "result", map[string]any{"tools": []any{
				map[string]any{"name": "noise", "inputSchema": object},
				map[string]any{"name": "badresult", "inputSchema": object},
				map[string]any{"name": "ok", "inputSchema": object},
			}})
		case req.Method == "tools/call" && req.Params.Name == "noise":
			fmt.Println("%%% this is not JSON-RPC %%%")
		case req.Method == "tools/call" && req.Params.Name == "badresult":
			reply(req.ID, "result", map[string]any{"content": []any{map[string]any{"type": "hologram"}}})
		case req.Method == "tools/call":
			reply(req.ID, "result", map[string]any{"content": []any{map[string]any{"type": "text", "text": "fine"}}})
		default:
			reply(req.ID, "error", map[string]any{"code": -32601, "message": "method not found"})
		}
	}
}
