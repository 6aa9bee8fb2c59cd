package mcptool_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/mcptool"
)

// filesystemServer returns node and the installed bin of the MCP filesystem
// server from npm (.ci/run installs it). Without them the test fails on CI
// (CI=true) and is skipped elsewhere, saying how to install them.
func filesystemServer(t *testing.T) (node, bin string) {
	t.Helper()
	node, nodeErr := exec.LookPath("node")
	bin, _ = filepath.Abs(filepath.Join("testdata", "npm", "node_modules", ".bin", "mcp-server-filesystem"))
	_, binErr := os.Stat(bin)
	if nodeErr == nil && binErr == nil {
		return node, bin
	}
	msg := fmt.Sprintf("the MCP filesystem server is not installed (node: %v; server: %v); install it with: npm ci --prefix tools/mcptool/testdata/npm", nodeErr, binErr)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return "", ""
}

// policyJSON is the default policy with these tool rules.
func policyJSON(tools string) string {
	return `{"version": "mcp-test", "default_approval": "required", "tools": {` + tools + `},
		"transports": {"cli": {"trust_boundary": "local", "interactive": true}},
		"default_transport": {"trust_boundary": "external", "interactive": true}}`
}

func jsonArgs(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFilesystemServerFromNPMThroughThePipeline(t *testing.T) {
	node, bin := filesystemServer(t)
	dir, err := filepath.EvalSymlinks(t.TempDir()) // the server's one allowed directory
	if err != nil {
		t.Fatal(err)
	}
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{
		"fs": {Command: node, Args: []string{bin, dir}},
	}}, fast())
	h := pipelinetest.Start(t, pipelinetest.Options{
		Policy:    policyJSON(`"echo": {"approval": "never"}, "fs.*": {"approval": "required"}, "fs.read_text_file": {"approval": "never"}`),
		Providers: []tools.Provider{p},
	})

	// Its tools are listed, as "fs.<tool>", with their schemas and hints.
	ctx, cancel := h.Ctx()
	defer cancel()
	specs, err := h.Tools.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]tools.Spec{}
	for _, s := range specs {
		byName[s.Name] = s
	}
	for _, name := range []string{"fs.read_text_file", "fs.write_file", "fs.list_directory", "fs.move_file"} {
		s, ok := byName[name]
		if !ok || s.Source != "mcp:fs" || len(s.InputSchema) == 0 || s.Description == "" {
			t.Fatalf("tool %s: %+v (listed: %v), want it from mcp:fs with a schema and a description", name, s, ok)
		}
	}
	if h := byName["fs.write_file"].Hints; h.Destructive == nil || !*h.Destructive {
		t.Errorf("fs.write_file hints %+v, want destructive", h)
	}
	if h := byName["fs.read_text_file"].Hints; h.ReadOnly == nil || !*h.ReadOnly {
		t.Errorf("fs.read_text_file hints %+v, want read-only", h)
	}

	// write_file waits for an approval, then writes the file.
	path, content := filepath.Join(dir, "hello.txt"), "written through Tollgate\n"
	turn := h.Send(h.Inbound("s-fs", "alice", pipelinetest.Call("fs.write_file", jsonArgs(t, map[string]string{"path": path, "content": content}))))
	a := h.WaitPending(schemas.ApprovalID(turn, 0))
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the file exists before the approval (%v)", err)
	}
	h.Decide(a.ApprovalID, schemas.OptionApprove, "alice")
	b, out := h.WaitTerminal(turn)
	if r := b.Results[0]; r.Status != schemas.ResultOK || !strings.Contains(r.Output, "Successfully wrote") || out.State != schemas.TurnCompleted {
		t.Fatalf("result %+v, outcome %s", r, out.State)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != content {
		t.Fatalf("file on disk: %q (%v), want %q", got, err, content)
	}

	// read_text_file, which the policy lets run, reads it back at once.
	turn = h.Send(h.Inbound("s-fs", "alice", pipelinetest.Call("fs.read_text_file", jsonArgs(t, map[string]string{"path": path}))))
	b, _ = h.WaitTerminal(turn)
	if r := b.Results[0]; r.Status != schemas.ResultOK || r.Output != content || r.ApprovalID != "" {
		t.Fatalf("fs.read_text_file: result %+v, want the file's content without an approval", r)
	}
}

func TestGarbageServerThroughThePipeline(t *testing.T) {
	srv := newTestServer(t, "garbage")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"g": srv.ServerConfig}}, fast())
	h := pipelinetest.Start(t, pipelinetest.Options{
		Policy:    policyJSON(`"echo": {"approval": "never"}, "g.*": {"approval": "never"}`),
		Providers: []tools.Provider{p},
	})
	turn := h.Send(h.Inbound("s-g", "alice", pipelinetest.Call("g.noise", "{}")))
	b, _ := h.WaitTerminal(turn)
	if r := b.Results[0]; r.Status != schemas.ResultNeedsAttention || r.Code != schemas.CodeToolReplyInvalid {
		t.Fatalf("result %+v, want needs_attention TOOL_REPLY_INVALID", r)
	}
	// The worker goes on with the session's next turn.
	turn = h.Send(h.Inbound("s-g", "alice", pipelinetest.Call("echo", `{"text":"still here"}`)))
	if b, _ := h.WaitTerminal(turn); b.Results[0].Status != schemas.ResultOK || b.Results[0].Output != "still here" {
		t.Fatalf("next turn: %+v", b.Results[0])
	}
}

func TestMCPToolNamedLikeAStaticToolIsRefusedAtStart(t *testing.T) {
	srv := newTestServer(t, "tools")
	p := mcptool.New(&mcptool.Config{Servers: map[string]mcptool.ServerConfig{"t": srv.ServerConfig}}, fast())
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := tollgate.New(ctx, tollgate.Config{
		JS: env.JS, Policy: policy.Default(), Keys: pipelinetest.Keys(t), Instance: "test", Topology: env.Topology,
		Logger: pipelinetest.Logger(), Tools: []tools.Tool{&pipelinetest.Counter{ToolName: "t.echo"}}, Providers: []tools.Provider{p},
	})
	if err == nil || !strings.Contains(err.Error(), "t.echo") {
		t.Fatalf("New: %v, want a start-up error naming t.echo", err)
	}
	for _, s := range srv.Starts(t) {
		if !gone(s.pid) {
			t.Errorf("server process %d still runs after the refused start", s.pid)
		}
	}
}
