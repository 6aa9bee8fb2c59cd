package natstool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// discoveryWait is the tests' DiscoveryWait: loopback answers take
// milliseconds, even under -race on a busy machine.
const discoveryWait = 300 * time.Millisecond

// connect opens a connection of its own to env's server (a tool service's
// process), closed at the end of the test.
func connect(t *testing.T, env *jstest.Env) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(env.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// endpoint is one endpoint of a test service.
type endpoint struct {
	name    string
	subject string            // "" is tollgate.tool.<service>.<name>
	meta    map[string]string // nil: a described tool
	handler micro.HandlerFunc // nil: answers "ok" with the call id
	opts    []micro.EndpointOpt
}

// tool returns the metadata of a described tool.
func tool(extra ...string) map[string]string {
	m := map[string]string{natstool.MetaDescription: "a test tool", natstool.MetaSchema: `{"type":"object"}`}
	for i := 0; i+1 < len(extra); i += 2 {
		m[extra[i]] = extra[i+1]
	}
	return m
}

// answer replies out with the request's call id, as a tool service must.
func answer(req micro.Request, out string) {
	_ = req.Respond([]byte(out), micro.WithHeaders(micro.Headers{natstool.HeaderCallID: {req.Headers().Get(natstool.HeaderCallID)}}))
}

// addService runs a micro service called name with eps on nc until the end
// of the test (or until the test stops it).
func addService(t *testing.T, nc *nats.Conn, name string, eps ...endpoint) micro.Service {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{Name: name, Version: "1.0.0"})
	if err != nil {
		t.Fatalf("add service %s: %v", name, err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	for _, ep := range eps {
		subject := ep.subject
		if subject == "" {
			subject = natstool.SubjectPrefix + strings.ToLower(name) + "." + ep.name
		}
		meta := ep.meta
		if meta == nil {
			meta = tool()
		}
		h := ep.handler
		if h == nil {
			h = func(req micro.Request) { answer(req, "ok") }
		}
		opts := append([]micro.EndpointOpt{micro.WithEndpointSubject(subject), micro.WithEndpointMetadata(meta)}, ep.opts...)
		if err := svc.AddEndpoint(ep.name, h, opts...); err != nil {
			t.Fatalf("add endpoint %s.%s: %v", name, ep.name, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return svc
}

// newProvider is a provider on env's client connection with the tests'
// discovery wait, o's other fields as given.
func newProvider(env *jstest.Env, o natstool.Options) *natstool.Provider {
	if o.DiscoveryWait == 0 {
		o.DiscoveryWait = discoveryWait
	}
	if o.Logger == nil {
		o.Logger = pipelinetest.Logger()
	}
	return natstool.New(env.NC, o)
}

// run runs p's refresh loop until the end of the test.
func run(t *testing.T, p *natstool.Provider) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-jstest.After(jstest.Wait):
			t.Error("Run did not return within a wait of its context's end")
		}
	})
}

// specs returns p's current tools by name, failing on an error.
func specs(t *testing.T, p *natstool.Provider) map[string]tools.Spec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts, err := p.Tools(ctx)
	if err != nil {
		t.Fatalf("Tools: %v", err)
	}
	out := map[string]tools.Spec{}
	for _, tl := range ts {
		out[tl.Name()] = tools.SpecOf(tl)
	}
	return out
}

// discoverUntil runs a discovery on p (Refresh) and polls until cond
// holds for its tools. It is for tests that run calls through a provider
// and must not have a timed refresh change its tools under them: such a
// provider has RefreshInterval stable and MinRefreshGap refreshGap, so
// the tools change only here. A discovery that heard a service too late
// (a loaded machine can delay an answer past DiscoveryWait, and the tools
// of a service that did not answer are gone) is simply run again.
func discoverUntil(t *testing.T, p *natstool.Provider, what string, cond func(map[string]tools.Spec) bool) {
	t.Helper()
	jstest.Eventually(t, pipelinetest.Wait, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), jstest.Wait)
		defer cancel()
		if err := p.Refresh(ctx); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		return cond(specs(t, p))
	})
}

// stable and refreshGap are the RefreshInterval and MinRefreshGap of a
// provider whose tools change only by discoverUntil.
const (
	stable     = time.Hour
	refreshGap = time.Millisecond
)

// waitTools polls p until cond holds for its tools.
func waitTools(t *testing.T, p *natstool.Provider, what string, cond func(map[string]tools.Spec) bool) map[string]tools.Spec {
	t.Helper()
	var got map[string]tools.Spec
	jstest.Eventually(t, pipelinetest.Wait, what, func() bool {
		got = specs(t, p)
		return cond(got)
	})
	return got
}

func TestDiscoveryOffersEndpointsWithTollgateMetadataAsTools(t *testing.T) {
	env := jstest.Start(t)
	nc := connect(t, env)
	tests := []struct {
		name    string
		service string
		ep      endpoint
		tool    string      // the tool's name, expected or would-be
		want    *tools.Spec // nil: not a tool
	}{
		{name: "an endpoint without tollgate metadata is not a tool", service: "plain",
			ep: endpoint{name: "ep", meta: map[string]string{"owner": "ops"}}, tool: "plain.ep"},
		{name: "a tool is named <service>.<endpoint>, lower-cased", service: "Deploys",
			ep:   endpoint{name: "Run", meta: tool()},
			tool: "deploys.run", want: &tools.Spec{Name: "deploys.run", Description: "a test tool", Source: "nats:Deploys", InputSchema: []byte(`{"type":"object"}`)}},
		{name: "tollgate.name names the tool", service: "named",
			ep:   endpoint{name: "ep", meta: tool(natstool.MetaName, "Named.Restart")},
			tool: "named.restart", want: &tools.Spec{Name: "named.restart", Description: "a test tool", Source: "nats:named", InputSchema: []byte(`{"type":"object"}`)}},
		{name: "the name is bound to the subject's service token, not to the service's name", service: "renamed",
			ep:   endpoint{name: "ep", subject: "tollgate.tool.ops.ep", meta: tool(natstool.MetaName, "ops.ep")},
			tool: "ops.ep", want: &tools.Spec{Name: "ops.ep", Description: "a test tool", Source: "nats:renamed", InputSchema: []byte(`{"type":"object"}`)}},
		{name: "a name outside its subject's service token is ignored", service: "impostor",
			ep: endpoint{name: "ep", meta: tool(natstool.MetaName, "payments.refund")}, tool: "payments.refund"},
		{name: "a subject with nothing after the service token is ignored", service: "short",
			ep: endpoint{name: "ep", subject: "tollgate.tool.short", meta: tool()}, tool: "short.ep"},
		{name: "retry_safe true makes the tool retry-safe", service: "safe",
			ep:   endpoint{name: "ep", meta: map[string]string{natstool.MetaRetrySafe: "true"}},
			tool: "safe.ep", want: &tools.Spec{Name: "safe.ep", Source: "nats:safe", RetrySafe: true}},
		{name: "retry_safe false is not retry-safe", service: "unsafe",
			ep:   endpoint{name: "ep", meta: map[string]string{natstool.MetaRetrySafe: "false"}},
			tool: "unsafe.ep", want: &tools.Spec{Name: "unsafe.ep", Source: "nats:unsafe"}},
		{name: "a name that is not a valid tool name is ignored", service: "badname",
			ep: endpoint{name: "ep", meta: tool(natstool.MetaName, "rm -rf")}, tool: "rm -rf"},
		{name: "a subject outside tollgate.tool is ignored", service: "outside",
			ep: endpoint{name: "ep", subject: "ops.outside.ep", meta: tool()}, tool: "outside.ep"},
		{name: "a wildcard subject is ignored", service: "wild",
			ep: endpoint{name: "ep", subject: "tollgate.tool.wild.*", meta: tool()}, tool: "wild.ep"},
		{name: "an unknown tollgate key is ignored, so that a typo cannot drop the schema", service: "typo",
			ep: endpoint{name: "ep", meta: map[string]string{"tollgate.shema": `{"type":"object"}`}}, tool: "typo.ep"},
		{name: "a schema that is not JSON is ignored", service: "badschema",
			ep: endpoint{name: "ep", meta: tool(natstool.MetaSchema, `{"type":`)}, tool: "badschema.ep"},
		{name: "a schema that is not a JSON object is ignored", service: "nullschema",
			ep: endpoint{name: "ep", meta: tool(natstool.MetaSchema, `null`)}, tool: "nullschema.ep"},
		{name: "a retry_safe other than true or false is ignored", service: "maybe",
			ep: endpoint{name: "ep", meta: tool(natstool.MetaRetrySafe, "yes")}, tool: "maybe.ep"},
	}
	for _, tc := range tests {
		addService(t, nc, tc.service, tc.ep)
	}
	got := specs(t, newProvider(env, natstool.Options{}))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, ok := got[tc.tool]
			switch {
			case tc.want == nil && ok:
				t.Fatalf("%s is offered as a tool: %+v", tc.tool, spec)
			case tc.want == nil:
			case !ok:
				t.Fatalf("%s is not offered; tools: %v", tc.tool, keys(got))
			case spec.Name != tc.want.Name || spec.Description != tc.want.Description || spec.Source != tc.want.Source ||
				string(spec.InputSchema) != string(tc.want.InputSchema) || spec.RetrySafe != tc.want.RetrySafe:
				t.Fatalf("spec %+v, want %+v", spec, *tc.want)
			}
		})
	}
	if len(got) != 5 {
		t.Fatalf("tools %v, want the 5 valid ones", keys(got))
	}
}

func keys(m map[string]tools.Spec) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestToolsAppearAndDisappearWithoutARestart(t *testing.T) {
	env := jstest.Start(t)
	p := newProvider(env, natstool.Options{RefreshInterval: 50 * time.Millisecond})
	run(t, p)
	if got := specs(t, p); len(got) != 0 {
		t.Fatalf("tools before any service: %v", keys(got))
	}
	svc := addService(t, connect(t, env), "late", endpoint{name: "tool"})
	waitTools(t, p, "late.tool offered", func(m map[string]tools.Spec) bool { _, ok := m["late.tool"]; return ok })
	if err := svc.Stop(); err != nil {
		t.Fatal(err)
	}
	waitTools(t, p, "late.tool gone", func(m map[string]tools.Spec) bool { _, ok := m["late.tool"]; return !ok })
}

// spy counts the discovery requests on env's bus.
type spy struct {
	env     *jstest.Env
	n       atomic.Int64
	markers atomic.Int64
}

func spyDiscoveries(t *testing.T, env *jstest.Env) *spy {
	t.Helper()
	s := &spy{env: env}
	nc := connect(t, env)
	if _, err := nc.Subscribe("$SRV.INFO", func(m *nats.Msg) {
		if string(m.Data) == "marker" {
			s.markers.Add(1)
		} else {
			s.n.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return s
}

// count returns how many discoveries the provider on env.NC has sent so
// far: it sends a marker on the same connection and waits for it, so that
// every earlier request has been counted.
func (s *spy) count(t *testing.T) int64 {
	t.Helper()
	want := s.markers.Load() + 1
	if err := s.env.NC.Publish("$SRV.INFO", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	jstest.Eventually(t, pipelinetest.Wait, "the spy saw the marker", func() bool { return s.markers.Load() >= want })
	return s.n.Load()
}

func TestToolsAnswersFromTheCache(t *testing.T) {
	env := jstest.Start(t)
	addService(t, connect(t, env), "cached", endpoint{name: "tool"})
	discoveries := spyDiscoveries(t, env)
	p := newProvider(env, natstool.Options{})

	// Many first callers at once share one discovery...
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, ok := specs(t, p)["cached.tool"]; !ok {
				t.Error("cached.tool not offered")
			}
		})
	}
	wg.Wait()
	// ...and later calls do not discover again.
	for range 50 {
		specs(t, p)
	}
	if n := discoveries.count(t); n != 1 {
		t.Fatalf("%d discoveries, want 1", n)
	}
}

func TestDiscoveryIsBounded(t *testing.T) {
	t.Run("by the number of service instances", func(t *testing.T) {
		env := jstest.Start(t)
		nc := connect(t, env)
		for i := range 5 {
			addService(t, nc, fmt.Sprintf("svc%d", i), endpoint{name: "tool"})
		}
		if got := specs(t, newProvider(env, natstool.Options{MaxServices: 3})); len(got) != 3 {
			t.Fatalf("tools %v, want those of 3 services", keys(got))
		}
	})
	t.Run("by the number of tools", func(t *testing.T) {
		env := jstest.Start(t)
		var eps []endpoint
		for i := range 5 {
			eps = append(eps, endpoint{name: fmt.Sprintf("t%d", i)})
		}
		addService(t, connect(t, env), "many", eps...)
		if got := specs(t, newProvider(env, natstool.Options{MaxTools: 2})); len(got) != 2 {
			t.Fatalf("tools %v, want 2", keys(got))
		}
	})
	t.Run("by the discovery wait: a slow answer is not waited for", func(t *testing.T) {
		env := jstest.Start(t)
		addService(t, connect(t, env), "prompt", endpoint{name: "tool"})
		// A "service" that answers discovery 5s late.
		slow := connect(t, env)
		if _, err := slow.Subscribe("$SRV.INFO", func(m *nats.Msg) {
			time.Sleep(5 * time.Second)
			_ = m.Respond([]byte(`{"type":"io.nats.micro.v1.info_response","name":"slow","id":"1","endpoints":[{"name":"tool","subject":"tollgate.tool.slow.tool","metadata":{"tollgate.description":"late"}}]}`))
		}); err != nil {
			t.Fatal(err)
		}
		if err := slow.Flush(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		got := specs(t, newProvider(env, natstool.Options{}))
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("the first Tools took %v", took)
		}
		if _, ok := got["prompt.tool"]; !ok || len(got) != 1 {
			t.Fatalf("tools %v, want prompt.tool only", keys(got))
		}
	})
	t.Run("by the caller's context on first use", func(t *testing.T) {
		env := jstest.Start(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if ts, err := newProvider(env, natstool.Options{}).Tools(ctx); err == nil {
			t.Fatalf("Tools on a cancelled context before any discovery: %d tools, no error", len(ts))
		}
	})
}

func TestConflictingOffersAreRefusedUntilResolved(t *testing.T) {
	env := jstest.Start(t)
	p := newProvider(env, natstool.Options{RefreshInterval: 50 * time.Millisecond})
	run(t, p)
	has := func(name string) func(map[string]tools.Spec) bool {
		return func(m map[string]tools.Spec) bool { _, ok := m[name]; return ok }
	}
	offer := func(service, name, subject string, opts ...micro.EndpointOpt) micro.Service {
		return addService(t, connect(t, env), service, endpoint{name: "ep", subject: subject, meta: tool(natstool.MetaName, name), opts: opts})
	}
	// A known tool and a control that stays.
	offer("shared", "shared.tool", "tollgate.tool.shared.a")
	offer("control", "control.tool", "tollgate.tool.control.a")
	waitTools(t, p, "shared.tool offered", has("shared.tool"))

	tests := []struct {
		name  string
		tool  string
		add   func() micro.Service
		check func(*testing.T, map[string]tools.Spec)
	}{
		{name: "one name on another subject: refused, even for the tool known first", tool: "shared.tool",
			add: func() micro.Service { return offer("shared2", "shared.tool", "tollgate.tool.shared.b") }},
		{name: "instances that disagree on what the tool is: refused", tool: "shared.tool",
			add: func() micro.Service {
				return addService(t, connect(t, env), "shared", endpoint{name: "ep", subject: "tollgate.tool.shared.a",
					meta: tool(natstool.MetaName, "shared.tool", natstool.MetaDescription, "something else")})
			}},
		{name: "a subject that backs another name too: both refused", tool: "shared.tool",
			add: func() micro.Service { return offer("alias", "shared.alias", "tollgate.tool.shared.a") }},
		{name: "instances that would each receive every call: refused", tool: "shared.tool",
			add: func() micro.Service {
				return offer("shared", "shared.tool", "tollgate.tool.shared.a", micro.WithEndpointQueueGroup("other"))
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := tt.add()
			got := waitTools(t, p, tt.tool+" refused", func(m map[string]tools.Spec) bool { return !has(tt.tool)(m) && has("control.tool")(m) })
			if _, ok := got["shared.alias"]; ok {
				t.Fatalf("shared.alias offered: %v", keys(got))
			}
			if err := svc.Stop(); err != nil {
				t.Fatal(err)
			}
			waitTools(t, p, tt.tool+" offered again once the conflict is gone", has(tt.tool))
		})
	}
}

func TestInstancesOfOneToolInOneQueueGroupAreOneTool(t *testing.T) {
	env := jstest.Start(t)
	for range 2 {
		addService(t, connect(t, env), "pair", endpoint{name: "tool", meta: tool(natstool.MetaRetrySafe, "true")})
	}
	addService(t, connect(t, env), "single", endpoint{name: "tool", opts: []micro.EndpointOpt{micro.WithEndpointQueueGroupDisabled()}})
	got := specs(t, newProvider(env, natstool.Options{}))
	if spec, ok := got["pair.tool"]; !ok || !spec.RetrySafe {
		t.Fatalf("tools %+v, want pair.tool, retry-safe", got)
	}
	if _, ok := got["single.tool"]; !ok {
		t.Fatalf("single.tool (one instance, no queue group) not offered: %v", keys(got))
	}
}

// records is a slog handler that keeps the messages logged.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, msg) {
			n++
		}
	}
	return n
}

func TestAnIgnoredEndpointIsLoggedOnce(t *testing.T) {
	env := jstest.Start(t)
	addService(t, connect(t, env), "bad", endpoint{name: "ep", subject: "elsewhere.ep"})
	log := &records{}
	discoveries := spyDiscoveries(t, env)
	run(t, newProvider(env, natstool.Options{Logger: slog.New(log), RefreshInterval: 20 * time.Millisecond}))
	jstest.Eventually(t, pipelinetest.Wait, "4 discoveries", func() bool { return discoveries.count(t) >= 4 })
	if n := log.count("endpoint ignored"); n != 1 {
		t.Fatalf("logged %d times, want once", n)
	}
}

// A service started after the provider's last discovery is found by the
// first call that names it, not RefreshInterval later; and a burst of
// calls of a tool nobody offers costs at most one discovery per gap.
func TestACallFindsAToolServiceThatJustStarted(t *testing.T) {
	env := jstest.Start(t)
	const gap = time.Second
	p := newProvider(env, natstool.Options{RefreshInterval: time.Hour, MinRefreshGap: gap})
	discoveries := spyDiscoveries(t, env)
	run(t, p)
	// Run's first discovery is under way before anything is counted (a
	// late one would count as the first call's).
	jstest.Eventually(t, pipelinetest.Wait, "Run's first discovery", func() bool { return discoveries.count(t) >= 1 })
	cat, err := tools.NewCatalog(context.Background(), nil, []tools.Provider{p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := specs(t, p); len(got) != 0 {
		t.Fatalf("tools before any service: %v", keys(got))
	}
	before := discoveries.count(t)

	addService(t, connect(t, env), "late", endpoint{name: "tool"})
	time.Sleep(gap) // Run's first discovery is now more than a gap old
	first := time.Now()
	if _, err := cat.Get(context.Background(), "late.tool"); err != nil {
		t.Fatalf("the first call of a tool whose service just started: %v", err)
	}
	if n := discoveries.count(t) - before; n != 1 {
		t.Fatalf("discoveries for the first call = %d, want 1", n)
	}

	// Within the gap, misses are answered from what the last look found.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := cat.Get(context.Background(), "late.nothing"); !errors.Is(err, &schemas.Error{Code: schemas.CodeToolNotFound}) {
				t.Errorf("unknown tool: got %v, want TOOL_NOT_FOUND", err)
			}
		})
	}
	wg.Wait()
	// Under load the burst may outlast a gap: one more discovery per gap
	// passed is the bound.
	bound := 1 + int64(time.Since(first)/gap)
	if n := discoveries.count(t) - before; n > bound {
		t.Fatalf("discoveries after a burst of 20 misses = %d, want at most %d (one per %v)", n, bound, gap)
	}
}

// A miss that comes while a discovery is under way shares it: it does not
// discover again as soon as that one ends, since the one it waited for
// started less than MinRefreshGap before it.
func TestAMissDuringADiscoveryDoesNotDiscoverAgain(t *testing.T) {
	env := jstest.Start(t)
	const gap, wait = time.Minute, 500 * time.Millisecond
	p := newProvider(env, natstool.Options{RefreshInterval: time.Hour, MinRefreshGap: gap, DiscoveryWait: wait})
	addService(t, connect(t, env), "busy", endpoint{name: "tool"}) // a discovery waits out DiscoveryWait
	discoveries := spyDiscoveries(t, env)
	// No discovery yet: the first miss discovers, and the wait is its own.
	first := make(chan error, 1)
	go func() { first <- p.Refresh(context.Background()) }()
	jstest.Eventually(t, pipelinetest.Wait, "the first miss's discovery under way", func() bool { return discoveries.count(t) == 1 })
	if err := p.Refresh(context.Background()); err != nil { // waits for the first, then shares it
		t.Fatalf("the second miss: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first miss: %v", err)
	}
	if n := discoveries.count(t); n != 1 {
		t.Fatalf("discoveries for two misses, the second during the first's discovery = %d, want 1", n)
	}
}
