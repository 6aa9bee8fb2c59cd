package stagecmd

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// freePort is a loopback TCP port that was free a moment ago, below the
// ephemeral range (embedded.FreePort), for a process that starts later.
func freePort(t *testing.T) int {
	t.Helper()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return port
}

// ensure is what awaitBroker retries for a stage that provisions.
func ensure(js jetstream.JetStream, topo topology.Config) func(context.Context) error {
	return func(ctx context.Context) error { return topology.Ensure(ctx, js, topo) }
}

func TestAStageStartedBeforeItsBrokerWaitsForIt(t *testing.T) {
	port := freePort(t)
	nc, js, err := scaffold.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), "", "early-stage", pipelinetest.Logger(), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatalf("connect while the broker is down: %v", err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- awaitBroker(ctx, ensure(js, topology.DefaultConfig()), pipelinetest.Logger(), 30*time.Second)
	}()

	select {
	case err := <-done:
		t.Fatalf("awaitBroker returned %v with no broker running", err)
	case <-time.After(500 * time.Millisecond): // it must still be waiting: nothing to wait for but time
	}
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: port, ReadyTimeout: jstest.Ready()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if err := <-done; err != nil {
		t.Fatalf("awaitBroker after the broker came up: %v", err)
	}
	if _, err := js.Stream(ctx, topology.StreamTurns); err != nil {
		t.Fatalf("topology not created: %v", err)
	}
}

func TestAStageGivesUpAtOnceWhenTheBrokerRefusesItsTopology(t *testing.T) {
	srv, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, ReadyTimeout: jstest.Ready()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, js, err := scaffold.Connect(srv.ClientURL(), "", "misconfigured-stage", pipelinetest.Logger(), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	topo := topology.DefaultConfig()
	topo.Replicas = 3 // a single server cannot hold three replicas
	start := time.Now()
	err = awaitBroker(context.Background(), ensure(js, topo), pipelinetest.Logger(), time.Minute)
	if err == nil || !refused(err) {
		t.Fatalf("got %v, want the server's refusal", err)
	}
	if waited := time.Since(start); waited > 20*time.Second {
		t.Fatalf("waited %v on a refusal that waiting cannot change", waited)
	}
}

func TestRefusedIsWhatWaitingCannotChange(t *testing.T) {
	api := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("ensure topology: %w", &jetstream.APIError{Code: 503, ErrorCode: code})
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"a cluster still electing its meta leader is waited for", api(10008), false},
		{"JetStream not enabled yet is waited for", api(jetstream.JSErrCodeJetStreamNotEnabled), false},
		{"JetStream not enabled for the account yet is waited for", api(jetstream.JSErrCodeJetStreamNotEnabledForAccount), false},
		{"a timeout is waited for", context.DeadlineExceeded, false},
		{"too many replicas for the cluster is a refusal", api(10074), true},
		{"a stream with another configuration is a refusal", api(jetstream.JSErrCodeStreamNameInUse), true},
		{"a topology not provisioned is not waited for", fmt.Errorf("check: %w", topology.ErrNotProvisioned), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refused(tc.err); got != tc.want {
				t.Fatalf("refused(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
