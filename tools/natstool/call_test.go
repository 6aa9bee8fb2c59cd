package natstool_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// turnContext is a verified context as the engine passes it to a tool.
func turnContext() *schemas.TurnContext {
	return &schemas.TurnContext{
		V: 1, SessionID: "s-1", TurnID: "cli:m-1", Transport: "cli",
		Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Display: "Alice", Kind: schemas.SenderUser, Verified: true},
		Channel:   schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM},
		Audience:  schemas.AudiencePersonal, TrustBoundary: "local", Interactive: true,
		Seal: &schemas.Seal{KeyID: "k1", MAC: []byte("mac")},
	}
}

// received is what a test service saw of a request.
type received struct {
	header nats.Header
	body   natstool.Request
	raw    map[string]json.RawMessage
}

// lookup returns the provider's tool called name.
func lookup(t *testing.T, p *natstool.Provider, name string) tools.Tool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts, err := p.Tools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range ts {
		if tl.Name() == name {
			return tl
		}
	}
	t.Fatalf("no tool %s", name)
	return nil
}

func TestTheReplyRules(t *testing.T) {
	env := jstest.Start(t)
	var mu sync.Mutex
	var got []received
	record := func(req micro.Request) {
		r := received{header: nats.Header(req.Headers())}
		_ = json.Unmarshal(req.Data(), &r.body)
		_ = json.Unmarshal(req.Data(), &r.raw)
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
	}
	withID := func(id string) micro.RespondOpt {
		return micro.WithHeaders(micro.Headers{natstool.HeaderCallID: {id}})
	}
	idOf := func(req micro.Request) string { return req.Headers().Get(natstool.HeaderCallID) }
	handlers := map[string]micro.HandlerFunc{
		"ok": func(req micro.Request) { record(req); answer(req, "done") },
		"failed": func(req micro.Request) {
			record(req)
			_ = req.Error("409", "already deployed", []byte("details"), withID(idOf(req)))
		},
		"no-id": func(req micro.Request) { record(req); _ = req.Respond([]byte("done")) },
		"other-id": func(req micro.Request) {
			record(req)
			_ = req.Respond([]byte("done"), withID("cli:m-0-0"))
		},
		"too-big": func(req micro.Request) { record(req); answer(req, strings.Repeat("x", 2048)) },
		"exactly-the-limit": func(req micro.Request) {
			record(req)
			answer(req, strings.Repeat("x", 1024))
		},
		"silent": func(req micro.Request) { record(req) },
		"twice": func(req micro.Request) {
			record(req)
			answer(req, "first "+idOf(req))
			answer(req, "second "+idOf(req))
		},
		"not-utf8": func(req micro.Request) { record(req); answer(req, "a\xffb") },
	}
	var eps []endpoint
	for name, h := range handlers {
		eps = append(eps, endpoint{name: name, handler: h})
	}
	svcNC := connect(t, env)
	addService(t, svcNC, "rules", eps...)
	p := newProvider(env, natstool.Options{MaxReplyBytes: 1024})

	tests := []struct {
		name     string
		tool     string
		timeout  time.Duration
		want     string       // the output, when the call succeeds ({id}: the call id)
		code     schemas.Code // the error's code ("" for a plain error)
		sentinel error        // tools.ErrUncertain, tools.ErrUnavailable or nil
		errHas   string
	}{
		{name: "a reply with the call id is the output", tool: "ok", want: "done"},
		{name: "a reply as long as the limit is the output", tool: "exactly-the-limit", want: strings.Repeat("x", 1024)},
		{name: "a service error is the tool's error, not an uncertain outcome", tool: "failed", errHas: "409: already deployed: details"},
		{name: "a reply without the call id is TOOL_REPLY_INVALID and uncertain", tool: "no-id",
			code: schemas.CodeToolReplyInvalid, sentinel: tools.ErrUncertain},
		{name: "a reply naming another call is TOOL_REPLY_INVALID and uncertain", tool: "other-id",
			code: schemas.CodeToolReplyInvalid, sentinel: tools.ErrUncertain, errHas: "cli:m-0-0"},
		{name: "a reply over the size limit is TOOL_REPLY_INVALID and uncertain", tool: "too-big",
			code: schemas.CodeToolReplyInvalid, sentinel: tools.ErrUncertain, errHas: "2048 bytes"},
		{name: "no reply before the deadline is EXECUTION_UNCERTAIN", tool: "silent", timeout: 300 * time.Millisecond,
			code: schemas.CodeExecutionUncertain, sentinel: tools.ErrUncertain},
		{name: "only the first of two replies counts", tool: "twice", want: "first {id}"},
		{name: "invalid UTF-8 in a reply is replaced", tool: "not-utf8", want: "a\uFFFDb"},
	}
	tc := turnContext()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			callID := "cli:m-1-" + strconv.Itoa(i)
			timeout := tt.timeout
			if timeout == 0 {
				timeout = 10 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			out, err := lookup(t, p, "rules."+tt.tool).Run(ctx, tools.Call{Context: tc, CallID: callID, Args: `{"n":1}`})
			if took := time.Since(start); took > timeout+2*time.Second {
				t.Fatalf("Run took %v with a %v deadline", took, timeout)
			}
			checkErr(t, out, err, strings.ReplaceAll(tt.want, "{id}", callID), tt.code, tt.sentinel, tt.errHas)
		})
	}

	t.Run("the second reply of a call is not taken as the next call's answer", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		twice := lookup(t, p, "rules.twice")
		for _, id := range []string{"cli:m-2-0", "cli:m-2-1"} {
			out, err := twice.Run(ctx, tools.Call{Context: tc, CallID: id, Args: `{}`})
			if err != nil || out != "first "+id {
				t.Fatalf("call %s: %q, %v", id, out, err)
			}
		}
	})

	t.Run("the request carries the call id, the arguments, the deadline and a view of the context", func(t *testing.T) {
		deadline := time.Now().Add(7 * time.Second)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		// The arguments cannot stand in for the context: they are a value
		// of their own.
		args := `{"context":{"requester":{"principal":"cli:mallory"}},"requester":"mallory"}`
		mu.Lock()
		got = nil
		mu.Unlock()
		if _, err := lookup(t, p, "rules.ok").Run(ctx, tools.Call{Context: tc, CallID: "cli:m-1-42", Args: args}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 1 {
			t.Fatalf("%d requests received, want 1", len(got))
		}
		r := got[0]
		if h := r.header.Get(natstool.HeaderCallID); h != "cli:m-1-42" {
			t.Fatalf("header %s = %q", natstool.HeaderCallID, h)
		}
		want := natstool.Request{
			CallID: "cli:m-1-42", Args: json.RawMessage(args), Deadline: deadline.UTC(),
			Context: natstool.ContextView{
				TurnID: "cli:m-1", SessionID: "s-1", Transport: "cli",
				Requester: natstool.RequesterView{Principal: "cli:alice", ID: "alice", Display: "Alice", Kind: "user", Verified: true},
				Channel:   natstool.ChannelView{ID: "dm-alice", Kind: "dm"},
				Audience:  "personal", TrustBoundary: "local",
			},
		}
		if r.body.CallID != want.CallID || string(r.body.Args) != args || !r.body.Deadline.Equal(want.Deadline) || r.body.Context != want.Context {
			t.Fatalf("request\n %+v\nwant\n %+v", r.body, want)
		}
		for k := range r.raw {
			if k != "call_id" && k != "args" && k != "deadline" && k != "context" {
				t.Fatalf("request has field %q", k)
			}
		}
		if strings.Contains(string(r.raw["context"]), "seal") || strings.Contains(string(r.raw["context"]), "mac") {
			t.Fatalf("the context view carries the seal: %s", r.raw["context"])
		}
	})

	t.Run("no responders is TOOL_UNAVAILABLE: the tool certainly did not run", func(t *testing.T) {
		// Discovered, then its service stops: the cache still offers it.
		gone := lookup(t, p, "rules.ok")
		if err := svcNC.Drain(); err != nil {
			t.Fatal(err)
		}
		jstest.Eventually(t, jstest.Wait, "the service's connection closed", svcNC.IsClosed)
		mu.Lock()
		before := len(got)
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := gone.Run(ctx, tools.Call{Context: tc, CallID: "cli:m-3-0", Args: `{}`})
		checkErr(t, out, err, "", schemas.CodeToolUnavailable, tools.ErrUnavailable, "no service answers")
		mu.Lock()
		defer mu.Unlock()
		if len(got) != before {
			t.Fatalf("a stopped service received the call")
		}
	})
}

// checkErr checks a Run's result against the expected output or error.
func checkErr(t *testing.T, out string, err error, want string, code schemas.Code, sentinel error, errHas string) {
	t.Helper()
	if code == "" && sentinel == nil && errHas == "" {
		if err != nil || out != want {
			t.Fatalf("got %q, %v; want %q", out, err, want)
		}
		return
	}
	if err == nil {
		t.Fatalf("got %q, no error", out)
	}
	if c := schemas.CodeOf(err); c != code {
		t.Fatalf("error %v has code %q, want %q", err, c, code)
	}
	for _, s := range []error{tools.ErrUncertain, tools.ErrUnavailable} {
		if errors.Is(err, s) != (s == sentinel) {
			t.Fatalf("error %v: errors.Is(%v) = %v", err, s, errors.Is(err, s))
		}
	}
	if !strings.Contains(err.Error(), errHas) {
		t.Fatalf("error %q does not say %q", err, errHas)
	}
}
