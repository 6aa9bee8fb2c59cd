package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

func TestHintFitsTheFailure(t *testing.T) {
	const url = "nats://127.0.0.1:4999"
	const noServer = "is `tollgate dev` (make run) running? is --nats right?"
	noTopology := "connected to " + url + " but Tollgate's topology is missing"
	for _, tc := range []struct {
		name string
		err  error
		want string // "" for no hint
	}{
		{"no server answers", fmt.Errorf("connect %s: %w", url, nats.ErrNoServers), noServer},
		{"a bucket is missing", fmt.Errorf("open bucket tollgate_approvals: %w", jetstream.ErrBucketNotFound), noTopology},
		{"a stream is missing", fmt.Errorf("consumer: %w", jetstream.ErrStreamNotFound), noTopology},
		{"no stream takes a published subject", fmt.Errorf("publish: %w", jetstream.ErrNoStreamResponse), noTopology},
		{"a message that only reads like a missing bucket", errors.New("nats: bucket not found"), ""},
		{"a timeout", context.DeadlineExceeded, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := hint(tc.err, url)
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("hint(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

func TestClientCommandsHintAtWhatIsMissing(t *testing.T) {
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	down := fmt.Sprintf("nats://127.0.0.1:%d", port)
	// A server without Tollgate's streams and buckets: a plain nats-server
	// with JetStream, or one the stages never started on.
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, ReadyTimeout: jstest.Ready()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	bare := ns.ClientURL()
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"pending with no server", []string{"pending", "--nats", down}, "hint: is `tollgate dev` (make run) running?"},
		{"pending on a server without the buckets", []string{"pending", "--nats", bare}, "hint: connected to " + bare + " but Tollgate's topology is missing"},
		{"dlq on a server without the streams", []string{"dlq", "--nats", bare}, "hint: connected to " + bare + " but Tollgate's topology is missing"},
		{"send on a server without the streams", []string{"send", "--nats", bare, "--session", "s", "--sender", "alice"}, "hint: connected to " + bare + " but Tollgate's topology is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, tc.args...)
			if code != 1 || !strings.Contains(errOut, tc.says) {
				t.Fatalf("exit %d, stderr %q; want 1 and %q", code, errOut, tc.says)
			}
		})
	}
}

// After a bucket is deleted on a server whose streams are there, the hint
// is replay --rebuild, not to start the stages.
func TestADeletedBucketHintsAtReplayRebuild(t *testing.T) {
	h := pt.Start(t, pt.Options{Stages: []string{}})
	if err := h.JS.DeleteKeyValue(jstest.Ctx(t), topology.BucketApprovals); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "pending", "--nats", h.Env.URL())
	if code != 1 || !strings.Contains(errOut, "hint: ") || !strings.Contains(errOut, "tollgate replay --rebuild") || strings.Contains(errOut, "start the stages") {
		t.Fatalf("exit %d, stderr %q; want 1 and a hint at replay --rebuild", code, errOut)
	}
}
