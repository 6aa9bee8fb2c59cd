package docs

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/tollgate-dev/tollgate/policy"
)

// The agents' configurations in docs/api.md ("Configuring an agent") are
// checked as documents: their CLIs are not installed here and need a
// model to run. Each block is found by the word after its language
// (```toml codex-config), parsed, and every key checked against the
// agent's own documented configuration schema for the version the docs
// name; the values Tollgate needs are checked against what the docs say.

// codexHTTPKeys are the keys of a Codex CLI [mcp_servers.<name>] table of
// a streamable HTTP server: RawMcpServerConfig in openai/codex
// codex-rs/config/src/mcp_types.rs (read at commit 00b17c26; the keys the
// docs use are those of Codex CLI 0.169.0), less the stdio-only ones
// (command, args, env, env_vars, cwd) and bearer_token, which Codex
// refuses for a streamable HTTP server.
var codexHTTPKeys = []string{
	"url", "bearer_token_env_var", "http_headers", "env_http_headers",
	"experimental_environment", "startup_timeout_sec", "startup_timeout_ms", "tool_timeout_sec",
	"enabled", "required", "supports_parallel_tool_calls", "default_tools_approval_mode",
	"enabled_tools", "disabled_tools", "scopes", "oauth", "oauth_resource", "name", "tools",
}

// codexApprovalModes are the values of default_tools_approval_mode
// (AppToolApproval in the same file).
var codexApprovalModes = []string{"auto", "prompt", "approve"}

// geminiServerKeys are the keys of a Gemini CLI settings.json
// mcpServers.<name> entry: MCPServerConfig in google-gemini/gemini-cli
// packages/core/src/config/config.ts and docs/tools/mcp-server.md
// ("Configuration Properties"), as of Gemini CLI 0.61.0.
var geminiServerKeys = []string{
	"command", "args", "env", "cwd", "url", "httpUrl", "headers", "tcp",
	"timeout", "trust", "description", "includeTools", "excludeTools",
	"oauth", "authProviderType", "targetAudience", "targetServiceAccount",
}

// claudeHTTPKeys are the keys of a Claude Code .mcp.json server of type
// "http" (code.claude.com/docs/en/mcp: type, url, headers, and
// headersHelper, a command that prints headers).
var claudeHTTPKeys = []string{"type", "url", "headers", "headersHelper"}

// agentBlock returns the one block of docs/api.md marked with word.
func agentBlock(t *testing.T, word string) block {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	bs, err := parseFenced("docs/api.md", string(data), true)
	if err != nil {
		t.Fatal(err)
	}
	var found []block
	for _, b := range bs {
		if slices.Contains(strings.Fields(b.info), word) {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("docs/api.md: %d blocks marked %q, want 1", len(found), word)
	}
	return found[0]
}

// unknownKeys are the keys of m not in allowed, sorted.
func unknownKeys(m map[string]any, allowed []string) []string {
	var out []string
	for k := range m {
		if !slices.Contains(allowed, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// onlyKeys fails for every key of m that is not in allowed.
func onlyKeys(t *testing.T, b block, what string, m map[string]any, allowed []string) {
	t.Helper()
	for _, k := range unknownKeys(m, allowed) {
		t.Errorf("%s: %s has key %q, which its schema does not know (it knows %v)", b, what, k, allowed)
	}
}

const mcpURL = "http://127.0.0.1:8080/mcp"

// documentedExpiry is the approval expiry of the policy the section's
// settings are sized for, read with Tollgate's own policy parser.
func documentedExpiry(t *testing.T) time.Duration {
	t.Helper()
	b := agentBlock(t, "mcp-policy")
	p, err := policy.Parse([]byte(b.text))
	if err != nil {
		t.Fatalf("%s: the policy does not load: %v", b, err)
	}
	d := p.ExpiresAfter("write_file")
	if d <= 0 {
		t.Fatalf("%s: the policy sets no expiry for write_file", b)
	}
	return d
}

func TestTheDocumentedAgentConfigurationsAreValid(t *testing.T) {
	expiry := documentedExpiry(t)

	t.Run("Codex CLI's config.toml names only keys Codex knows, hands calls over and outwaits the expiry", func(t *testing.T) {
		b := agentBlock(t, "codex-config")
		var doc map[string]any
		if _, err := toml.Decode(b.text, &doc); err != nil {
			t.Fatalf("%s: not TOML: %v", b, err)
		}
		servers, _ := doc["mcp_servers"].(map[string]any)
		srv, _ := servers["tollgate"].(map[string]any)
		if len(doc) != 1 || len(servers) != 1 || srv == nil {
			t.Fatalf("%s: want exactly [mcp_servers.tollgate], got %v", b, doc)
		}
		onlyKeys(t, b, "[mcp_servers.tollgate]", srv, codexHTTPKeys)
		if srv["url"] != mcpURL {
			t.Errorf("%s: url %v, want %s", b, srv["url"], mcpURL)
		}
		if srv["bearer_token_env_var"] != "TOLLGATE_KEY" {
			t.Errorf("%s: bearer_token_env_var %v, want TOLLGATE_KEY", b, srv["bearer_token_env_var"])
		}
		mode, _ := srv["default_tools_approval_mode"].(string)
		if !slices.Contains(codexApprovalModes, mode) || mode != "approve" {
			t.Errorf("%s: default_tools_approval_mode %q, want approve (Codex refuses destructive tools otherwise)", b, mode)
		}
		sec, ok := srv["tool_timeout_sec"].(int64)
		if !ok || time.Duration(sec)*time.Second <= expiry {
			t.Errorf("%s: tool_timeout_sec %v, want whole seconds above the policy's expiry %v", b, srv["tool_timeout_sec"], expiry)
		}
	})

	t.Run("Gemini CLI's settings.json names only keys Gemini knows, trusts Tollgate and outwaits the expiry", func(t *testing.T) {
		b, srv := jsonServer(t, "gemini-settings", geminiServerKeys)
		if srv["httpUrl"] != mcpURL {
			t.Errorf("%s: httpUrl %v, want %s (url is the SSE transport)", b, srv["httpUrl"], mcpURL)
		}
		if srv["trust"] != true {
			t.Errorf("%s: trust %v, want true (Tollgate is the approval)", b, srv["trust"])
		}
		ms, ok := srv["timeout"].(float64)
		if !ok || time.Duration(ms)*time.Millisecond <= expiry {
			t.Errorf("%s: timeout %v, want milliseconds above the policy's expiry %v", b, srv["timeout"], expiry)
		}
	})

	t.Run("Claude Code's .mcp.json names only keys Claude Code knows", func(t *testing.T) {
		b, srv := jsonServer(t, "claude-mcp", claudeHTTPKeys)
		if srv["type"] != "http" || srv["url"] != mcpURL {
			t.Errorf("%s: type %v url %v, want http %s", b, srv["type"], srv["url"], mcpURL)
		}
	})
}

// jsonServer reads the block marked word, a JSON document with exactly
// one server, mcpServers.tollgate, checks its keys against allowed and
// that it sends the key of TOLLGATE_KEY, and returns the block and the
// server.
func jsonServer(t *testing.T, word string, allowed []string) (block, map[string]any) {
	t.Helper()
	b := agentBlock(t, word)
	var doc struct {
		MCPServers map[string]map[string]any `json:"mcpServers"`
	}
	if err := strictJSON(b.text, &doc); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	srv := doc.MCPServers["tollgate"]
	if len(doc.MCPServers) != 1 || srv == nil {
		t.Fatalf("%s: want exactly mcpServers.tollgate, got %v", b, doc.MCPServers)
	}
	onlyKeys(t, b, "mcpServers.tollgate", srv, allowed)
	if h, _ := srv["headers"].(map[string]any); h["Authorization"] != "Bearer ${TOLLGATE_KEY}" {
		t.Errorf("%s: headers %v, want the key from TOLLGATE_KEY", b, srv["headers"])
	}
	return b, srv
}

// strictJSON decodes one JSON document into v, refusing unknown fields
// of v's structs and anything after the document.
func strictJSON(text string, v any) error {
	d := json.NewDecoder(strings.NewReader(text))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if err := d.Decode(new(any)); err != io.EOF {
		return errors.New("text after the JSON document")
	}
	return nil
}

// The key check catches what it must: a key the agent does not know, and
// another agent's key.
func TestTheAgentKeyCheckCatchesForeignKeys(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     string
		allowed []string
	}{
		{"Codex refuses an inline bearer_token", "bearer_token", codexHTTPKeys},
		{"a Gemini key in a Codex table", "httpUrl", codexHTTPKeys},
		{"a Codex key in Gemini's settings", "bearer_token_env_var", geminiServerKeys},
		{"Gemini's httpUrl in Claude Code's .mcp.json", "httpUrl", claudeHTTPKeys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unknownKeys(map[string]any{tc.key: "x"}, tc.allowed); !slices.Equal(got, []string{tc.key}) {
				t.Fatalf("unknown keys %v, want [%s]", got, tc.key)
			}
		})
	}
}
