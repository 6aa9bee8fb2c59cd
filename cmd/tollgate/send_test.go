package main

import (
	"strings"
	"testing"
	"time"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

func TestSendRefusesWhatIngestWouldDeadLetter(t *testing.T) {
	env := jstest.Start(t)
	send := func(extra ...string) []string {
		return append([]string{"send", "--nats", env.URL(), "--session", "s-send", "--sender", "alice"}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		code schemas.Code
	}{
		{"arguments that are not JSON", send("--call", `echo={"text":`), schemas.CodeArgsInvalidJSON},
		{"arguments that are a JSON array", send("--call", `echo=[1,2]`), schemas.CodeArgsInvalidJSON},
		{"a valid call next to an invalid one", send("--call", `echo={}`, "--call", `write_file={path:"a"}`), schemas.CodeArgsInvalidJSON},
		{"a tool name with a space", send("--call", `Bad Tool={}`), schemas.CodeInvalidInput},
		{"a tool name with a path in it", send("--call", `echo/../x={}`), schemas.CodeInvalidInput},
		{"a channel kind that does not exist", send("--channel-kind", "broadcast"), schemas.CodeInvalidInput},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			if code != 1 || out != "" {
				t.Fatalf("exit %d, stdout %q; want exit 1 and no turn id", code, out)
			}
			if !strings.Contains(errOut, "refused") || strings.Count(errOut, string(tc.code)) != 1 {
				t.Fatalf("stderr %q does not refuse with %s (named once)", errOut, tc.code)
			}
		})
	}
	// A valid send after the refused ones is published; it is the only
	// message in the stream, so none of the refused ones was.
	code, out, errOut := runCLI(t, send("--message-id", "m-ok", "--call", `echo={"text":"hi"}`)...)
	if code != 0 || strings.TrimSpace(out) != schemas.TurnID("cli", "m-ok") {
		t.Fatalf("valid send: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	s, err := env.JS.Stream(jstest.Ctx(t), topology.StreamInbound)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("%s holds %d messages, want only the valid one", topology.StreamInbound, n)
	}
	m, err := s.GetLastMsgForSubject(jstest.Ctx(t), topology.InboundSubject("cli", "s-send"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := schemas.Decode[schemas.InboundMessage](m.Data)
	if err != nil || in.MessageID != "m-ok" {
		t.Fatalf("stored message %+v (%v), want m-ok", in, err)
	}
}

// With an executor running, send checks each call as the executor would:
// a tool it does not have and arguments its schema refuses are refused
// with their codes (the reason naming the property), and nothing is
// published.
func TestSendRefusesCallsTheExecutorWouldFail(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{pt.Executor}})
	jstest.Eventually(t, pt.Wait, "the executor answers "+topology.SubjectToolsList, func() bool {
		_, err := h.Env.NC.Request(topology.SubjectToolsList, nil, time.Second)
		return err == nil
	})
	send := func(extra ...string) []string {
		return append([]string{"send", "--nats", h.Env.URL(), "--session", "s-check", "--sender", "alice"}, extra...)
	}
	for _, tc := range []struct {
		name, call string
		code       schemas.Code
		names      string
	}{
		{"a tool that does not exist", `nosuchtool={}`, schemas.CodeToolNotFound, "nosuchtool"},
		{"arguments the schema refuses", `write_file={"path":"a","content":"b","no_such_property":1}`, schemas.CodeArgsInvalid, "no_such_property"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, send("--call", tc.call)...)
			if code != 1 || out != "" || !strings.Contains(errOut, string(tc.code)) || !strings.Contains(errOut, tc.names) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 refusing with %s naming %s", code, out, errOut, tc.code, tc.names)
			}
		})
	}
	code, out, errOut := runCLI(t, send("--message-id", "m-checked", "--call", `echo={"text":"hi"}`)...)
	if code != 0 || strings.TrimSpace(out) != schemas.TurnID("cli", "m-checked") || strings.Contains(errOut, "warning") {
		t.Fatalf("valid send: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	s, err := h.Env.JS.Stream(jstest.Ctx(t), topology.StreamInbound)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("%s holds %d messages, want only the valid one", topology.StreamInbound, n)
	}
}
