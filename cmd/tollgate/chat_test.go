package main

import (
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// Without a planner, chat says so and exits 1: before publishing anything
// when the planner's consumer does not exist, and when the planner's
// consumer exists but ingest takes the text as a turn with no calls (no
// planner routes it), once that turn completes with no reply.
func TestChatWithoutAPlannerSaysSo(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	url := "--nats=" + h.Env.URL()
	code, out, errOut := runCLI(t, "chat", "--session", "s-noplan", "--sender", "alice", "--answer=false", "--wait", "20s", url, "hi")
	if code != 1 || !strings.Contains(errOut, "no planner is running") || !strings.Contains(errOut, "--llm-url") || out != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q: want exit 1 saying no planner runs and how to start one", code, out, errOut)
	}
	s, err := h.Env.JS.Stream(jstest.Ctx(t), topology.StreamInbound)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("%s holds %d messages, want none published", topology.StreamInbound, n)
	}

	// A planner ran here once (its consumers exist), but none runs now and
	// ingest does not route text to it.
	for _, c := range topology.PlannerConsumers() {
		if _, err := h.Env.JS.CreateOrUpdateConsumer(jstest.Ctx(t), c.Stream, c.Config); err != nil {
			t.Fatal(err)
		}
	}
	code, _, errOut = runCLI(t, "chat", "--session", "s-noplan", "--sender", "alice", "--answer=false", "--wait", "20s", url, "hi")
	if code != 1 || !strings.Contains(errOut, "no planner answered") {
		t.Fatalf("exit %d, stderr %q: want exit 1 saying no planner answered", code, errOut)
	}
}
