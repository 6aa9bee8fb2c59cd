package mcptool_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/mcptool"
)

type pathArgs struct {
	Path string `json:"path"`
}

// addPreviewTools adds the tools of the preview test to the stdio test
// server: "put" names its read-only preview tool in _meta (structured
// {kind, text}), "say" one answering text, "slow" one that never answers,
// "broken" one that fails, "sneaky" one that is not read-only.
func addPreviewTools(s *mcp.Server) {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true}
	noop := func(context.Context, *mcp.CallToolRequest, pathArgs) (*mcp.CallToolResult, any, error) {
		return textResult("done"), nil, nil
	}
	for _, name := range []string{"put", "say", "slow", "broken", "sneaky"} {
		mcp.AddTool(s, &mcp.Tool{Name: name, Meta: mcp.Meta{mcptool.PreviewMeta: name + "_preview"}}, noop)
	}
	mcp.AddTool(s, &mcp.Tool{Name: "put_preview", Annotations: ro},
		func(_ context.Context, req *mcp.CallToolRequest, a pathArgs) (*mcp.CallToolResult, any, error) {
			return nil, tools.Preview{Kind: tools.PreviewNewFile, Text: a.Path + " by " + req.Params.Meta[mcptool.CallIDMeta].(string)}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "say_preview", Annotations: ro},
		func(_ context.Context, _ *mcp.CallToolRequest, a pathArgs) (*mcp.CallToolResult, any, error) {
			return textResult("would touch " + a.Path), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "slow_preview", Annotations: ro},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ pathArgs) (*mcp.CallToolResult, any, error) {
			<-ctx.Done()
			return nil, nil, ctx.Err()
		})
	mcp.AddTool(s, &mcp.Tool{Name: "broken_preview", Annotations: ro},
		func(context.Context, *mcp.CallToolRequest, pathArgs) (*mcp.CallToolResult, any, error) {
			r := textResult("cannot read the target")
			r.IsError = true
			return r, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sneaky_preview"}, noop)
}

// An MCP server offers a preview of a tool by naming, in the tool's _meta
// (dev.tollgate/preview), another of its tools annotated read-only: it is
// called with the call's arguments and id, and its structured or text
// answer, an error result and no answer in time come out of
// tools.PreviewCall as ok, failed and timed_out. A preview tool that is
// not read-only gives no preview.
func TestMCPServerPreviewTool(t *testing.T) {
	srv := newTestServer(t, "preview")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"t": srv.ServerConfig}}, fast())
	run(t, p)
	waitTool(t, p, "t.put")
	byName := toolsByName(t, p)
	c := tools.Call{CallID: "c-7", Args: `{"path":"a.txt"}`}
	// A preview that answers gets an ordinary test wait (it returns as soon
	// as it has its answer, however loaded the machine); the one that never
	// answers gets a short deadline, both scaled like every other wait.
	answers, hangs := jstest.Scale(jstest.Wait), jstest.Scale(500*time.Millisecond)
	for _, tc := range []struct {
		tool, status, kind, has string
		deadline                time.Duration
	}{
		{"t.put", tools.PreviewOK, tools.PreviewNewFile, "a.txt by c-7", answers},
		{"t.say", tools.PreviewOK, tools.PreviewText, "would touch a.txt", answers},
		{"t.slow", tools.PreviewTimedOut, "", "no preview within " + hangs.String(), hangs},
		{"t.broken", tools.PreviewFailed, "", "cannot read the target", answers},
		{"t.sneaky", tools.PreviewUnsupported, "", "", answers},
		{"t.say_preview", tools.PreviewUnsupported, "", "", answers},
	} {
		r := tools.PreviewCall(context.Background(), byName[tc.tool], c, tc.deadline)
		if r.Status != tc.status || r.Kind != tc.kind || !strings.Contains(r.Text+r.Reason, tc.has) {
			t.Errorf("%s: preview %+v, want %s %s with %q", tc.tool, r, tc.status, tc.kind, tc.has)
		}
	}
	if out, err := call(t, context.Background(), byName["t.put"], `{"path":"a.txt"}`); err != nil || out != "done" {
		t.Fatalf("the tool with a preview runs as before: %q %v", out, err)
	}
}
