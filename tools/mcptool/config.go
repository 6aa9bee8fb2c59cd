package mcptool

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

// Config is a tools file: the MCP servers whose tools Tollgate offers.
//
//	{"mcp_servers": {
//	  "files":  {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/share"]},
//	  "github": {"url": "https://api.example.com/mcp", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}}
//	}}
type Config struct {
	// Servers by name. The name is the prefix of the server's tools
	// ("files.read_text_file"), in calls and in the policy ("files.*").
	Servers map[string]ServerConfig `json:"mcp_servers"`
}

// ServerConfig is one MCP server: a command that speaks MCP on its stdin
// and stdout (Command, Args, Env), or a streamable-HTTP endpoint (URL,
// Headers). Exactly one of Command and URL is set.
type ServerConfig struct {
	// Command is run with Args. It is looked up on PATH when it has no
	// slash.
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// Env is the environment of Command, besides the few variables it
	// inherits from Tollgate's own (HOME, LOGNAME, PATH, SHELL, TERM,
	// TMPDIR, USER, LANG, LC_ALL): a server never sees Tollgate's secrets
	// unless the tools file passes them on.
	Env map[string]string `json:"env,omitempty"`
	// URL is the server's streamable-HTTP endpoint (http or https).
	URL string `json:"url,omitempty"`
	// Headers are sent with every HTTP request to URL.
	Headers map[string]string `json:"headers,omitempty"`
}

// inheritedEnv are the variables of Tollgate's environment that a stdio
// server's command inherits; everything else it gets comes from
// ServerConfig.Env.
var inheritedEnv = []string{"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "TMPDIR", "USER", "LANG", "LC_ALL"}

// maxConfigBytes bounds a tools file.
const maxConfigBytes = 1 << 20

// maxServerName leaves room for a tool name after "<server>." within the
// 64 bytes of a tool name.
const maxServerName = 32

// LoadConfig reads the tools file at path. It decodes it strictly (an
// unknown field or trailing data is an error), replaces every ${VAR} in
// command, args, env values, url and header values with the variable from
// the environment (a variable that is not set is an error: nothing is sent
// to a server with a hole in it), and checks every server: its name is
// [a-z0-9_-]{1,32} (a valid tool-name prefix), exactly one of command and
// url is set, a command is found, a url is http(s) with a host, and args
// and env go with a command and headers with a url. Every error names the
// file and the server.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mcp tools file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("mcp tools file %s: %w", path, err)
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("mcp tools file %s: larger than %d bytes", path, maxConfigBytes)
	}
	cfg, err := parseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("mcp tools file %s: %w", path, err)
	}
	return cfg, nil
}

func parseConfig(b []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the tools object")
	}
	if cfg.Servers == nil {
		return nil, errors.New(`"mcp_servers" is required`)
	}
	for _, name := range sortedKeys(cfg.Servers) {
		sc := cfg.Servers[name]
		if err := sc.expand(); err != nil {
			return nil, fmt.Errorf("server %q: %w", name, err)
		}
		if err := sc.check(name); err != nil {
			return nil, fmt.Errorf("server %q: %w", name, err)
		}
		cfg.Servers[name] = sc
	}
	return &cfg, nil
}

// expand replaces ${VAR} in every value that may carry one.
func (sc *ServerConfig) expand() error {
	var errs []error
	ex := func(s string) string {
		out, err := expandEnv(s)
		if err != nil {
			errs = append(errs, err)
		}
		return out
	}
	sc.Command = ex(sc.Command)
	for i := range sc.Args {
		sc.Args[i] = ex(sc.Args[i])
	}
	for k, v := range sc.Env {
		sc.Env[k] = ex(v)
	}
	sc.URL = ex(sc.URL)
	for k, v := range sc.Headers {
		sc.Headers[k] = ex(v)
	}
	return errors.Join(errs...)
}

// varRef is a ${...} reference; its content must be a variable name.
var (
	varRef  = regexp.MustCompile(`\$\{[^}]*\}`)
	varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// expandEnv replaces each ${NAME} in s with the value of the environment
// variable NAME. A variable that is not set, or a ${...} that is not a
// variable name, is an error. A "$" not followed by "{" is kept as is.
func expandEnv(s string) (string, error) {
	var errs []error
	out := varRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := ref[2 : len(ref)-1]
		if !varName.MatchString(name) {
			errs = append(errs, fmt.Errorf("%q is not a ${VARIABLE} reference", ref))
			return ""
		}
		v, ok := os.LookupEnv(name)
		if !ok {
			errs = append(errs, fmt.Errorf("environment variable %s is not set", name))
		}
		return v
	})
	if strings.Contains(varRef.ReplaceAllString(s, ""), "${") {
		errs = append(errs, errors.New(`unterminated "${"`))
	}
	return out, errors.Join(errs...)
}

// check validates one server's settings (after expansion).
func (sc *ServerConfig) check(name string) error {
	if err := checkServerName(name); err != nil {
		return err
	}
	switch {
	case sc.Command == "" && sc.URL == "":
		return errors.New(`one of "command" and "url" is required`)
	case sc.Command != "" && sc.URL != "":
		return errors.New(`"command" and "url" exclude each other`)
	case sc.Command != "":
		if len(sc.Headers) > 0 {
			return errors.New(`"headers" go with "url", not with "command"`)
		}
		if _, err := exec.LookPath(sc.Command); err != nil {
			return fmt.Errorf("command: %w", err)
		}
		for k := range sc.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return fmt.Errorf("env: invalid variable name %q", k)
			}
		}
	default:
		if len(sc.Args) > 0 || len(sc.Env) > 0 {
			return errors.New(`"args" and "env" go with "command", not with "url"`)
		}
		u, err := url.Parse(sc.URL)
		if err != nil {
			return fmt.Errorf("url: %w", err)
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("url %q: want http:// or https:// with a host", sc.URL)
		}
		for k, v := range sc.Headers {
			if !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") {
				return fmt.Errorf("headers: invalid header %q", k)
			}
		}
	}
	return nil
}

// checkServerName enforces [a-z0-9_-]{1,32}: a server's name, with a dot
// after it, prefixes its tools' names, so a dot inside it would make
// "a.b.c" ambiguous between server "a" and server "a.b".
func checkServerName(name string) error {
	if name == "" || len(name) > maxServerName {
		return fmt.Errorf("name must be 1 to %d bytes", maxServerName)
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return errors.New("name: only a-z 0-9 _ - are allowed")
		}
	}
	return nil
}

// validHeaderName reports whether k is an HTTP header name (an RFC 9110
// token).
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range []byte(k) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
