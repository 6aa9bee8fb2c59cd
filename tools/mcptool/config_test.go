package mcptool_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/tools/mcptool"
)

func TestLoadConfig(t *testing.T) {
	t.Setenv("MCPTEST_TOKEN", "s3cret")
	t.Setenv("MCPTEST_DIR", "/srv/share")
	t.Setenv("MCPTEST_EMPTY", "")
	tests := []struct {
		name string
		file string
		want string // an error's text, "" for none
		cfg  *mcptool.Config
	}{
		{"a stdio and an HTTP server, variables replaced", `{"mcp_servers": {
			"files": {"command": "sh", "args": ["-c", "x", "${MCPTEST_DIR}"], "env": {"TOKEN": "${MCPTEST_TOKEN}", "EMPTY": "${MCPTEST_EMPTY}", "COST": "$5"}},
			"git-hub_2": {"url": "https://mcp.example.com/${MCPTEST_TOKEN}", "headers": {"Authorization": "Bearer ${MCPTEST_TOKEN}"}}}}`,
			"", &mcptool.Config{Servers: map[string]mcptool.ServerConfig{
				"files":     {Command: "sh", Args: []string{"-c", "x", "/srv/share"}, Env: map[string]string{"TOKEN": "s3cret", "EMPTY": "", "COST": "$5"}},
				"git-hub_2": {URL: "https://mcp.example.com/s3cret", Headers: map[string]string{"Authorization": "Bearer s3cret"}},
			}}},
		{"no servers at all", `{"mcp_servers": {}}`, "", &mcptool.Config{Servers: map[string]mcptool.ServerConfig{}}},
		{"a variable that is not set", `{"mcp_servers": {"h": {"url": "http://127.0.0.1/", "headers": {"Authorization": "Bearer ${MCPTEST_MISSING}"}}}}`,
			`server "h": environment variable MCPTEST_MISSING is not set`, nil},
		{"a reference that is not a variable", `{"mcp_servers": {"s": {"command": "sh", "args": ["${1X}"]}}}`, `"${1X}" is not a ${VARIABLE} reference`, nil},
		{"an unterminated reference", `{"mcp_servers": {"s": {"command": "sh", "args": ["${HOME"]}}}`, `unterminated "${"`, nil},
		{"an unknown field", `{"mcp_servers": {"s": {"command": "sh", "cwd": "/"}}}`, `unknown field "cwd"`, nil},
		{"an unknown section", `{"mcp_servers": {}, "servers": {}}`, `unknown field "servers"`, nil},
		{"trailing data", `{"mcp_servers": {}} {}`, "trailing data", nil},
		{"no mcp_servers", `{}`, `"mcp_servers" is required`, nil},
		{"a name with a dot", `{"mcp_servers": {"a.b": {"command": "sh"}}}`, `server "a.b": name: only a-z 0-9 _ - are allowed`, nil},
		{"an upper-case name", `{"mcp_servers": {"Files": {"command": "sh"}}}`, `server "Files": name: only`, nil},
		{"a name too long", `{"mcp_servers": {"` + strings.Repeat("a", 33) + `": {"command": "sh"}}}`, "name must be 1 to 32 bytes", nil},
		{"neither command nor url", `{"mcp_servers": {"s": {"args": ["x"]}}}`, `one of "command" and "url" is required`, nil},
		{"both command and url", `{"mcp_servers": {"s": {"command": "sh", "url": "http://127.0.0.1/"}}}`, `"command" and "url" exclude each other`, nil},
		{"headers with a command", `{"mcp_servers": {"s": {"command": "sh", "headers": {"A": "b"}}}}`, `"headers" go with "url"`, nil},
		{"env with a url", `{"mcp_servers": {"s": {"url": "http://127.0.0.1/", "env": {"A": "b"}}}}`, `"args" and "env" go with "command"`, nil},
		{"a command that is not found", `{"mcp_servers": {"s": {"command": "no-such-command-anywhere"}}}`, `server "s": command: exec: "no-such-command-anywhere"`, nil},
		{"a url that is not http", `{"mcp_servers": {"s": {"url": "file:///etc/passwd"}}}`, "want http:// or https:// with a host", nil},
		{"a header that is not a header", `{"mcp_servers": {"s": {"url": "http://127.0.0.1/", "headers": {"Bad Name": "x"}}}}`, `invalid header "Bad Name"`, nil},
		{"a header value with a newline", `{"mcp_servers": {"s": {"url": "http://127.0.0.1/", "headers": {"X-A": "a\r\nX-B: b"}}}}`, `invalid header "X-A"`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tools.json")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := mcptool.LoadConfig(path)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("LoadConfig: %v", err)
				}
				if !reflect.DeepEqual(cfg, tc.cfg) {
					t.Fatalf("config %+v, want %+v", cfg, tc.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("LoadConfig: %v, want an error naming the file and containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfigOfAMissingFile(t *testing.T) {
	if _, err := mcptool.LoadConfig(filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("LoadConfig of a missing file: %v", err)
	}
}
