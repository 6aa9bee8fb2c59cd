package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// The example, built and run as its own process against a broker, runs a
// turn that calls its own tool: the outcome carries what word_count
// returned. The test's harness runs no stage and does not know the tool, so
// only the example's process can have run it.
func TestTheExampleRunsItsOwnToolThroughThePipeline(t *testing.T) {
	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := childproc.Build(ctx, bin, false, "./examples/customtool"); err != nil {
		t.Fatalf("build the example: %v", err)
	}
	keyFile := filepath.Join(t.TempDir(), "seal-keys.json")
	kf := seal.NewFile("k1")
	if err := kf.Write(keyFile); err != nil {
		t.Fatal(err)
	}
	keys, err := kf.Ring()
	if err != nil {
		t.Fatal(err)
	}
	env := jstest.Start(t)
	h := pipelinetest.Start(t, pipelinetest.Options{Env: env, Keys: keys, Stages: []string{}})
	if _, err := h.Tools.Get(context.Background(), "word_count"); err == nil {
		t.Fatal("the harness has a word_count tool of its own")
	}

	proc, err := childproc.Start(filepath.Join(bin, "customtool"), t.TempDir(), filepath.Join(t.TempDir(), "customtool.log"),
		childproc.Env(), "-nats", env.URL(), "-seal-keys", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proc.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("customtool log:\n%s", proc.LogText())
		}
	})

	turn := h.Send(h.Inbound("s-1", "alice", pipelinetest.Call("word_count", `{"text":"one two three"}`)))
	b, out := h.WaitTerminal(turn)
	if b.State != schemas.BatchCompleted || len(out.Results) != 1 {
		t.Fatalf("turn ended %s (%s) with %d results, want completed with 1", b.State, b.Code, len(out.Results))
	}
	if r := out.Results[0]; r.Status != schemas.ResultOK || r.Output != "3 words, counted for cli:alice" {
		t.Fatalf("word_count result: %s %q, want ok %q", r.Status, r.Output, "3 words, counted for cli:alice")
	}
	if proc.Exited() {
		t.Fatalf("the example exited: %v", proc.Err())
	}

	// A copy of the example beside it (an executor with word_count) starts.
	start := func(t *testing.T, url string) *childproc.Proc {
		p, err := childproc.Start(filepath.Join(bin, "customtool"), t.TempDir(), filepath.Join(t.TempDir(), "customtool.log"),
			childproc.Env(), "-nats", url, "-seal-keys", keyFile)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(10 * time.Second) })
		return p
	}
	t.Run("a copy of itself on the broker", func(t *testing.T) {
		twin := start(t, env.URL())
		jstest.Eventually(t, jstest.LongWait, "the copy runs", func() bool {
			return strings.Contains(twin.LogText(), "customtool running") || twin.Exited()
		})
		if twin.Exited() {
			t.Fatalf("the copy exited: %v\n%s", twin.Err(), twin.LogText())
		}
	})

	// Beside an executor without word_count (tollgate dev, make run), it
	// refuses to start, saying why, instead of losing calls to it.
	t.Run("beside an executor without word_count", func(t *testing.T) {
		other := jstest.Start(t)
		pipelinetest.Start(t, pipelinetest.Options{Env: other, Keys: keys, Stages: []string{pipelinetest.Executor}})
		jstest.Eventually(t, jstest.LongWait, "the executor answers", func() bool {
			_, err := other.NC.Request(topology.SubjectToolsList, nil, time.Second)
			return err == nil
		})
		p := start(t, other.URL())
		select {
		case <-p.Done():
		case <-jstest.After(jstest.LongWait):
			t.Fatalf("the example runs beside another executor:\n%s", p.LogText())
		}
		if log := p.LogText(); p.Err() == nil || !strings.Contains(log, "TOOL_NOT_FOUND") || !strings.Contains(log, "-share") {
			t.Fatalf("exit %v, log:\n%s\nwant a failure naming TOOL_NOT_FOUND and -share", p.Err(), log)
		}
	})
}
