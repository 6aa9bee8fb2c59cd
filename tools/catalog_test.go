package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

type named string

func (n named) Name() string                                  { return string(n) }
func (named) Run(context.Context, tools.Call) (string, error) { return "", nil }

// remote is a provider's tool: a name, a source and a schema.
type remote struct {
	name, source string
	schema       string
}

func (r remote) Name() string                                  { return r.name }
func (remote) Run(context.Context, tools.Call) (string, error) { return "ran", nil }
func (r remote) Spec() tools.Spec {
	return tools.Spec{Source: r.source, InputSchema: json.RawMessage(r.schema), Description: "a remote tool"}
}

// provider is a tools.Provider whose tools the test changes.
type provider struct {
	name string

	mu    sync.Mutex
	tools []tools.Tool
	err   error
}

func newProvider(name string, names ...string) *provider {
	p := &provider{name: name}
	p.set(names...)
	return p
}

func (p *provider) Name() string { return p.name }

func (p *provider) Tools(context.Context) ([]tools.Tool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.tools), p.err
}

// set replaces the provider's tools with tools of these names.
func (p *provider) set(names ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tools = nil
	for _, n := range names {
		p.tools = append(p.tools, remote{name: n, source: p.name})
	}
}

func (p *provider) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

// sourceOf resolves name and returns its tool's source.
func sourceOf(t *testing.T, c *tools.Catalog, name string) string {
	t.Helper()
	tool, err := c.Get(context.Background(), name)
	if err != nil {
		t.Fatalf("Get(%s): %v", name, err)
	}
	return tools.SpecOf(tool).Source
}

func TestNewCatalogRefusesWhatCannotBeResolved(t *testing.T) {
	bad := remote{name: "bad_schema", schema: `{"type":"objekt"}`}
	tests := []struct {
		name      string
		static    []tools.Tool
		providers []tools.Provider
		want      []string // in the error; none: no error
	}{
		{"static and provider tools with distinct names", []tools.Tool{tools.Echo{}},
			[]tools.Provider{newProvider("nats", "deploy.run"), newProvider("mcp:github", "github.create_issue")}, nil},
		{"a provider that cannot list its tools yet is no error", []tools.Tool{tools.Echo{}},
			[]tools.Provider{&provider{name: "down", err: errors.New("no connection")}}, nil},
		{"a provider tool named like a built-in", []tools.Tool{tools.Echo{}},
			[]tools.Provider{newProvider("mcp:everything", "echo")}, []string{"mcp:everything offers echo", "builtin"}},
		{"a provider tool named like a Go tool", []tools.Tool{named("deploy.run")},
			[]tools.Provider{newProvider("nats", "deploy.run")}, []string{"nats offers deploy.run", "go"}},
		{"two providers offering one name", nil,
			[]tools.Provider{newProvider("nats", "fs.read"), newProvider("mcp:fs", "fs.read")}, []string{"mcp:fs offers fs.read, which provider nats already offers"}},
		{"one provider offering a name twice", nil,
			[]tools.Provider{newProvider("nats", "fs.read", "fs.read")}, []string{"nats offers fs.read twice"}},
		{"a static tool named twice", []tools.Tool{named("a"), named("a")}, nil, []string{"a registered twice"}},
		{"a nil static tool", []tools.Tool{nil}, nil, []string{"tool 0 is nil"}},
		{"an unnamed static tool", []tools.Tool{named("")}, nil, []string{"has no name"}},
		{"a nil provider", nil, []tools.Provider{nil}, []string{"provider 0 is nil"}},
		{"a static tool whose schema does not compile", []tools.Tool{bad}, nil, []string{"bad_schema: input schema does not compile"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tools.NewCatalog(context.Background(), tc.static, tc.providers, nil)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("NewCatalog: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("NewCatalog accepted it, want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestCatalogGet(t *testing.T) {
	nats := newProvider("nats", "deploy.run")
	down := &provider{name: "mcp:down"}
	c, err := tools.NewCatalog(context.Background(), []tools.Tool{tools.Echo{}}, []tools.Provider{nats, down}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name   string
		ctx    context.Context
		tool   string
		setup  func()
		want   string // the source of the tool found
		code   schemas.Code
		anyErr bool
	}{
		{name: "a static tool", tool: "echo", want: "builtin"},
		{name: "a provider's tool", tool: "deploy.run", want: "nats"},
		{name: "a tool nobody has", tool: "deploy.stop", code: schemas.CodeToolNotFound},
		{name: "a tool that appeared since start", tool: "deploy.stop", setup: func() { nats.set("deploy.run", "deploy.stop") }, want: "nats"},
		{name: "a tool that disappeared", tool: "deploy.run", setup: func() { nats.set("deploy.stop") }, code: schemas.CodeToolNotFound},
		{name: "a tool nobody has while a provider cannot list", tool: "mail.send", setup: func() { down.fail(errors.New("server exited")) },
			code: schemas.CodeToolUnavailable},
		{name: "a tool another provider has while one cannot list", tool: "deploy.stop", want: "nats"},
		{name: "a static tool with an ended context", ctx: cancelled, tool: "echo", want: "builtin"},
		{name: "an ended context is not a verdict on the tool", ctx: cancelled, tool: "mail.send", anyErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			tool, err := c.Get(ctx, tc.tool)
			switch {
			case tc.anyErr:
				if err == nil || schemas.Permanent(err) {
					t.Fatalf("Get = %v, %v; want a transient error", tool, err)
				}
			case tc.code != "":
				if schemas.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.tool) {
					t.Fatalf("Get = %v, %v; want %s naming %s", tool, err, tc.code, tc.tool)
				}
			case err != nil || tool.Name() != tc.tool || tools.SpecOf(tool).Source != tc.want:
				t.Fatalf("Get = %v, %v; want %s from %s", tool, err, tc.tool, tc.want)
			}
		})
	}
}

// A collision that appears after start is resolved, never refused: a
// static tool keeps its name, and a provider that had a name keeps it
// while it offers it.
func TestCatalogCollisionsAfterStart(t *testing.T) {
	first, second := newProvider("nats"), newProvider("mcp:fs")
	c, err := tools.NewCatalog(context.Background(), []tools.Tool{tools.Echo{}}, []tools.Provider{first, second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name          string
		first, second []string
		tool, want    string
	}{
		{"a provider tool named like a built-in is ignored", []string{"echo"}, nil, "echo", "builtin"},
		{"the later of two providers gets a free name", nil, []string{"fs.read"}, "fs.read", "mcp:fs"},
		{"an earlier provider offering it later does not take it", []string{"fs.read"}, []string{"fs.read"}, "fs.read", "mcp:fs"},
		{"its holder withdraws it: the other provider gets it", []string{"fs.read"}, nil, "fs.read", "nats"},
		{"its old holder offers it again: the new holder keeps it", []string{"fs.read"}, []string{"fs.read"}, "fs.read", "nats"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			first.set(s.first...)
			second.set(s.second...)
			if got := sourceOf(t, c, s.tool); got != s.want {
				t.Fatalf("%s resolves to %s's, want %s's", s.tool, got, s.want)
			}
			specs, err := c.List(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(specs, func(sp tools.Spec) bool { return sp.Name == s.tool })
			if i < 0 || specs[i].Source != s.want {
				t.Fatalf("List has %+v, want %s from %s", specs, s.tool, s.want)
			}
		})
	}
}

func TestCatalogList(t *testing.T) {
	dir := t.TempDir()
	builtins, err := tools.Builtins(dir)
	if err != nil {
		t.Fatal(err)
	}
	nats, down := newProvider("nats", "deploy.run", "a.first"), &provider{name: "mcp:down", err: errors.New("not started")}
	c, err := tools.NewCatalog(context.Background(), append(builtins, named("go_tool")), []tools.Provider{nats, down}, nil)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := c.List(context.Background())
	if err == nil || !strings.Contains(err.Error(), "mcp:down") {
		t.Fatalf("List error %v, want it to name the provider that cannot list", err)
	}
	var got []string
	for _, s := range specs {
		got = append(got, s.Name+"="+s.Source)
	}
	want := []string{"a.first=nats", "deploy.run=nats", "echo=builtin", "go_tool=go", "write_file=builtin"}
	if !slices.Equal(got, want) {
		t.Fatalf("List = %v, want %v (sorted, with sources)", got, want)
	}
	if !specs[2].RetrySafe || specs[4].RetrySafe || len(specs[4].InputSchema) == 0 || specs[4].Description == "" {
		t.Fatalf("built-in specs %+v, %+v: want echo retry-safe, write_file described with a schema", specs[2], specs[4])
	}
}

func TestCheckArgs(t *testing.T) {
	dir := t.TempDir()
	builtins, err := tools.Builtins(dir)
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type":"object"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &provider{name: "nats", tools: []tools.Tool{
		remote{name: "svc.nested", source: "nats:svc", schema: `{"type":"object","properties":{"items":{"type":"array","items":{"$ref":"#/$defs/item"}}},"$defs":{"item":{"type":"object","properties":{"qty":{"type":"integer","minimum":1}}}}}`},
		remote{name: "svc.broken", source: "nats:svc", schema: `{"type":"objekt"}`},
		remote{name: "svc.not_json", source: "nats:svc", schema: `{"type":`},
		remote{name: "svc.file_ref", source: "nats:svc", schema: `{"$ref":"file://` + secret + `"}`},
		remote{name: "svc.web_ref", source: "nats:svc", schema: `{"$ref":"http://127.0.0.1:1/schema.json"}`},
		remote{name: "svc.any", source: "nats:svc"},
	}}
	c, err := tools.NewCatalog(context.Background(), append(builtins, &tools.FollowUp{}), []tools.Provider{p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, tool, args string
		code             schemas.Code
		says             []string // in the reason
	}{
		{"echo with text", "echo", `{"text":"hi"}`, "", nil},
		{"echo without arguments", "echo", `{}`, "", nil},
		{"echo with a number for text", "echo", `{"text":3}`, schemas.CodeArgsInvalid,
			[]string{"at '/text'", "got number, want string", "schema #/properties/text/type"}},
		{"echo with an argument it does not take", "echo", `{"text":"x","loud":true}`, schemas.CodeArgsInvalid,
			[]string{"loud", "schema #/additionalProperties"}},
		{"write_file with a path and content", "write_file", `{"path":"a.txt","content":"x"}`, "", nil},
		{"write_file without a path", "write_file", `{"content":"x"}`, schemas.CodeArgsInvalid,
			[]string{"missing property 'path'", "schema #/required"}},
		{"write_file with an empty path", "write_file", `{"path":""}`, schemas.CodeArgsInvalid, []string{"at '/path'", "schema #/properties/path/minLength"}},
		{"schedule_followup with a tool and args", "schedule_followup", `{"tool":"echo","args":{"text":"x"},"delay":"1s"}`, "", nil},
		{"schedule_followup with args that are a list", "schedule_followup", `{"tool":"echo","args":[1]}`, schemas.CodeArgsInvalid,
			[]string{"at '/args'", "schema #/properties/args/type"}},
		{"a nested mismatch behind a reference", "svc.nested", `{"items":[{"qty":2},{"qty":0}]}`, schemas.CodeArgsInvalid,
			[]string{"at '/items/1/qty'", "schema #/$defs/item/properties/qty/minimum"}},
		{"a nested match behind a reference", "svc.nested", `{"items":[{"qty":2}]}`, "", nil},
		{"no schema takes any object", "svc.any", `{"whatever":[1,2]}`, "", nil},
		{"a schema that does not compile refuses the call", "svc.broken", `{}`, schemas.CodeToolUnavailable,
			[]string{"input schema of svc.broken does not compile"}},
		{"a schema that is not JSON refuses the call", "svc.not_json", `{}`, schemas.CodeToolUnavailable, []string{"does not compile"}},
		{"a schema referring to a file does not read it", "svc.file_ref", `{}`, schemas.CodeToolUnavailable, []string{"may not refer to other documents"}},
		{"a schema referring to a URL does not fetch it", "svc.web_ref", `{}`, schemas.CodeToolUnavailable, []string{"may not refer to other documents"}},
		{"an unknown tool", "nope", `{}`, schemas.CodeToolNotFound, []string{`"nope"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tool, spec, err := c.Check(context.Background(), tc.tool, tc.args)
			if tc.code == "" {
				if err != nil || tool == nil || tool.Name() != tc.tool || spec.Name != tc.tool {
					t.Fatalf("Check = %v, %+v, %v; want the tool", tool, spec, err)
				}
				return
			}
			if schemas.CodeOf(err) != tc.code || tool != nil {
				t.Fatalf("Check = %v, %v; want %s and no tool", tool, err, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Fatalf("reason %q does not say %q", err, s)
				}
			}
		})
	}
}

// The reason of ARGS_INVALID lists a bounded number of mismatches.
func TestCheckArgsListsABoundedNumberOfMismatches(t *testing.T) {
	p := &provider{name: "nats", tools: []tools.Tool{
		remote{name: "svc.many", source: "nats:svc", schema: `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"},"c":{"type":"string"},"d":{"type":"string"},"e":{"type":"string"},"f":{"type":"string"},"g":{"type":"string"}}}`},
	}}
	c, err := tools.NewCatalog(context.Background(), nil, []tools.Provider{p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Check(context.Background(), "svc.many", `{"a":1,"b":1,"c":1,"d":1,"e":1,"f":1,"g":1}`)
	if schemas.CodeOf(err) != schemas.CodeArgsInvalid {
		t.Fatalf("Check: %v, want ARGS_INVALID", err)
	}
	if n := strings.Count(err.Error(), "(schema #"); n != 5 || !strings.Contains(err.Error(), "and 2 more") {
		t.Fatalf("reason %q: %d mismatches listed, want 5 and a count of the 2 more", err, n)
	}
}
