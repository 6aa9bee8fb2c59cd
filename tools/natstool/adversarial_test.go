package natstool_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/micro"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// requests counts the requests test services receive, per tool.
type requests struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *requests) add(tool string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[tool]++
}

func (r *requests) of(tool string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[tool]
}

// offered reports whether the provider offers every one of names.
func offered(names ...string) func(map[string]tools.Spec) bool {
	return func(m map[string]tools.Spec) bool {
		for _, n := range names {
			if _, ok := m[n]; !ok {
				return false
			}
		}
		return true
	}
}

// approve sends alice's turn calling tool, approves it and returns the
// turn id and its one result once the turn is over.
func approve(h *pt.H, session, tool string) (string, schemas.ToolResult) {
	h.T.Helper()
	turn := h.Send(h.Inbound(session, "alice", pt.Call(tool, `{}`)))
	h.WaitPending(schemas.ApprovalID(turn, 0))
	h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
	b, out := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || len(out.Results) != 1 {
		h.T.Fatalf("batch %s (%s), %d results", b.State, b.Code, len(out.Results))
	}
	return turn, out.Results[0]
}

func TestMisbehavingToolServicesThroughThePipeline(t *testing.T) {
	env := jstest.Start(t)
	var got requests
	idOf := func(req micro.Request) string { return req.Headers().Get(natstool.HeaderCallID) }
	withID := func(id string) micro.RespondOpt {
		return micro.WithHeaders(micro.Headers{natstool.HeaderCallID: {id}})
	}
	handler := func(tool string, h func(micro.Request)) endpoint {
		return endpoint{name: tool, handler: func(req micro.Request) { got.add(tool); h(req) }}
	}
	addService(t, connect(t, env), "bad",
		handler("twice", func(req micro.Request) {
			answer(req, "first "+idOf(req))
			answer(req, "second "+idOf(req))
		}),
		handler("other-id", func(req micro.Request) { _ = req.Respond([]byte("done"), withID(idOf(req)+"0")) }),
		handler("too-big", func(req micro.Request) { answer(req, strings.Repeat("x", 8<<10)) }),
		handler("failing", func(req micro.Request) { _ = req.Error("500", "disk full", nil, withID(idOf(req))) }),
	)
	vanishing := addService(t, connect(t, env), "vanishing", handler("tool", func(req micro.Request) { answer(req, "done") }))
	// No timed refresh: a discovery that a loaded machine delays past
	// DiscoveryWait would take the tools away in the middle of a call.
	p := natstool.New(env.NC, natstool.Options{
		Logger: pt.Logger(), DiscoveryWait: discoveryWait, RefreshInterval: stable, MinRefreshGap: refreshGap, MaxReplyBytes: 4 << 10,
	})
	h := pt.Start(t, pt.Options{Env: env, Providers: []tools.Provider{p}})
	discoverUntil(t, p, "the services' tools offered", offered("bad.twice", "bad.other-id", "bad.too-big", "bad.failing", "vanishing.tool"))

	t.Run("a service that answers twice: the first answer is the result, the second no one's", func(t *testing.T) {
		h := h.For(t)
		for _, session := range []string{"twice-1", "twice-2"} {
			turn, r := approve(h, session, "bad.twice")
			if want := "first " + schemas.CallID(turn, 0); r.Status != schemas.ResultOK || r.Output != want {
				t.Fatalf("result %s %s (%s) %q, want ok %q", r.Status, r.Code, r.Reason, r.Output, want)
			}
			redeliver(h, turn, true)
		}
		if n := got.of("twice"); n != 2 {
			t.Fatalf("%d requests for 2 calls", n)
		}
	})

	for _, tc := range []struct {
		name   string
		tool   string
		status schemas.ResultStatus
		code   schemas.Code
	}{
		{"a service that answers with another call's id: needs attention, never sent again", "other-id", schemas.ResultNeedsAttention, schemas.CodeToolReplyInvalid},
		{"a reply over the size limit: needs attention, never sent again", "too-big", schemas.ResultNeedsAttention, schemas.CodeToolReplyInvalid},
		{"a service error: an error result, not a retry", "failing", schemas.ResultError, schemas.CodeToolFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := h.For(t)
			turn, r := approve(h, tc.tool, "bad."+tc.tool)
			if r.Status != tc.status || r.Code != tc.code {
				t.Fatalf("result %s %s (%s), want %s %s", r.Status, r.Code, r.Reason, tc.status, tc.code)
			}
			redeliver(h, turn, true)
			h.WaitIdle(pt.Executor, pt.Redriver)
			if n := got.of(tc.tool); n != 1 {
				t.Fatalf("the service received the call %d times, want once", n)
			}
		})
	}

	t.Run("a tool that disappears after its approval was requested fails closed with TOOL_NOT_FOUND", func(t *testing.T) {
		h := h.For(t)
		turn := h.Send(h.Inbound("vanishing", "alice", pt.Call("vanishing.tool", `{}`)))
		h.WaitPending(schemas.ApprovalID(turn, 0))
		if err := vanishing.Stop(); err != nil {
			t.Fatal(err)
		}
		discoverUntil(t, p, "vanishing.tool gone", func(m map[string]tools.Spec) bool { return !offered("vanishing.tool")(m) })
		h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
		_, out := h.WaitTerminal(turn)
		if r := out.Results[0]; r.Status != schemas.ResultFailed || r.Code != schemas.CodeToolNotFound {
			t.Fatalf("result %s %s (%s), want failed %s", r.Status, r.Code, r.Reason, schemas.CodeToolNotFound)
		}
		if n := got.of("tool"); n != 0 {
			t.Fatalf("the vanished service received %d requests", n)
		}
	})
}

func TestAToolWhoseServiceIsGoneButStillOfferedIsUnavailable(t *testing.T) {
	env := jstest.Start(t)
	var got requests
	svcNC := connect(t, env)
	addService(t, svcNC, "gone", endpoint{name: "tool", handler: func(req micro.Request) { got.add("tool"); answer(req, "done") }})
	// No refresh during the test: the tool stays offered.
	p := natstool.New(env.NC, natstool.Options{Logger: pt.Logger(), DiscoveryWait: discoveryWait, RefreshInterval: stable, MinRefreshGap: refreshGap})
	h := pt.Start(t, pt.Options{Env: env, Providers: []tools.Provider{p}})
	discoverUntil(t, p, "gone.tool offered", offered("gone.tool"))
	turn := h.Send(h.Inbound("gone", "alice", pt.Call("gone.tool", `{}`)))
	h.WaitPending(schemas.ApprovalID(turn, 0))
	if err := svcNC.Drain(); err != nil {
		t.Fatal(err)
	}
	jstest.Eventually(t, pt.Wait, "the service's connection closed", svcNC.IsClosed)
	h.Decide(schemas.ApprovalID(turn, 0), schemas.OptionApprove, "alice")
	_, out := h.WaitTerminal(turn)
	if r := out.Results[0]; r.Status != schemas.ResultFailed || r.Code != schemas.CodeToolUnavailable {
		t.Fatalf("result %s %s (%s), want failed %s", r.Status, r.Code, r.Reason, schemas.CodeToolUnavailable)
	}
	if !offered("gone.tool")(specs(t, p)) {
		t.Fatal("gone.tool was dropped from the cache: the test shows nothing")
	}
	if n := got.of("tool"); n != 0 {
		t.Fatalf("the stopped service received %d requests", n)
	}
}
