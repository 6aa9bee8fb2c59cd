package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// runner is a background task for Serve: it reports that it started and
// returns err when ctx ends (or at once, with fail).
type runner struct {
	started chan struct{}
	fail    error
}

func (r *runner) Run(ctx context.Context) error {
	close(r.started)
	if r.fail != nil {
		return r.fail
	}
	<-ctx.Done()
	return nil
}

// TestServeRunsTheWebhooksAndStopsGracefully: Serve answers on its
// listener, runs Config.Webhooks beside it, counts requests, and returns
// nil once its context ends; a webhook runner that fails stops Serve with
// its error.
func TestServeRunsTheWebhooksAndStopsGracefully(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{Stages: []string{}})
	serve := func(r *runner, reg prometheus.Registerer) (string, context.CancelFunc, chan error) {
		s, err := New(Config{JS: h.JS, Policy: h.Policy, Logger: pipelinetest.Logger(), Webhooks: r, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, ln) }()
		return "http://" + ln.Addr().String(), cancel, done
	}

	reg := prometheus.NewRegistry()
	ok := &runner{started: make(chan struct{})}
	url, cancel, done := serve(ok, reg)
	defer cancel()
	<-ok.started
	jstest.Eventually(t, jstest.Wait, "healthz answers", func() bool {
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	resp, err := http.Get(url + "/v1/approvals")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a key: %v %v", err, resp)
	}
	resp.Body.Close()
	counter, err := New(Config{JS: h.JS, Policy: h.Policy, Logger: pipelinetest.Logger(), Registerer: reg})
	if err == nil || counter != nil {
		t.Error("a second gateway registered the same metrics")
	}
	if n := requestsTotal(t, reg, "GET /v1/approvals", "401"); n != 1 {
		t.Errorf("requests_total{GET /v1/approvals,401} = %v, want 1", n)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-jstest.After(jstest.Wait):
		t.Fatal("Serve did not return after cancel")
	}

	boom := errors.New("webhooks broke")
	bad := &runner{started: make(chan struct{}), fail: boom}
	_, cancel2, done2 := serve(bad, nil)
	defer cancel2()
	select {
	case err := <-done2:
		if !errors.Is(err, boom) {
			t.Fatalf("Serve with a failing runner: %v, want %v", err, boom)
		}
	case <-jstest.After(jstest.Wait):
		t.Fatal("Serve went on after its runner failed")
	}
}

// requestsTotal reads the request counter of route and status in reg.
func requestsTotal(t *testing.T, reg *prometheus.Registry, route, status string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_gateway_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["status"] == status {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no tollgate_gateway_requests_total{route=%q,status=%q}", route, status)
	return 0
}
