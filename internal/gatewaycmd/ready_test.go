package gatewaycmd

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

// The gateway process is ready only while its webhook dispatcher
// consumes: /readyz has a "gateway/webhooks" check, which passes once the
// subscribers' consumers run and fails once they have stopped.
func TestTheGatewayIsReadyOnlyWhileItsWebhooksRun(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{})
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer recv.Close()
	secret := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	file := filepath.Join(t.TempDir(), "webhooks.json")
	conf := `{"subscribers":[{"id":"ready","url":"` + recv.URL + `","secret":"` + secret + `","transports":["gateway"],"events":["approval.requested","outcome"]}]}`
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ready, err := health.New(nil, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	proc := &scaffold.Process{Log: pipelinetest.Logger(), JS: h.JS, Reg: prometheus.NewRegistry(), Ready: ready}
	_, key := gateway.NewKey("gateway", []gateway.Scope{gateway.ScopeRead}, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, proc, h.Policy, []gateway.Key{key}, "127.0.0.1:0", file, 0, &inboxFlags{}) }()

	webhooks := func() (health.Result, bool) {
		c, cancel := context.WithTimeout(context.Background(), health.Timeout)
		defer cancel()
		for _, r := range ready.Report(c).Checks {
			if r.Name == "gateway/webhooks" {
				return r, true
			}
		}
		return health.Result{}, false
	}
	jstest.EventuallyState(t, pipelinetest.Wait, "the webhooks check passes", func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("run ended: %v", err)
		default:
		}
		r, ok := webhooks()
		return ok && r.OK, r.Error
	})

	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	if r, ok := webhooks(); !ok || r.OK || r.Error == "" {
		t.Fatalf("after the gateway stopped: %+v (found %v), want the webhooks check failing with a reason", r, ok)
	}
}
