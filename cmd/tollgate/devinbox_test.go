package main

import (
	"context"
	"errors"
	"github.com/prometheus/client_golang/prometheus"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// TestDevGatewayServesTheInbox: `tollgate dev` serves the web inbox at /
// next to the API, with its dev sign-in; on an address that is not a
// loopback one it refuses to start rather than offer dev sign-in there.
func TestDevGatewayServesTheInbox(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{Stages: []string{}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := runDevGateway(ctx, h.JS, h.Policy, h.Keys, t.TempDir(), addr, "", pipelinetest.Logger(), prometheus.NewRegistry(), cancel); err != nil {
		t.Fatal(err)
	}
	var page string
	jstest.Eventually(t, 10*time.Second, "the inbox's sign-in page is served", func() bool {
		resp, err := http.Get("http://" + addr + "/signin")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		page = string(b)
		return resp.StatusCode == http.StatusOK
	})
	if !strings.Contains(page, `action="/signin/dev"`) {
		t.Fatalf("no dev sign-in form:\n%s", page)
	}

	err = runDevGateway(ctx, h.JS, h.Policy, h.Keys, t.TempDir(), "0.0.0.0:0", "", pipelinetest.Logger(), prometheus.NewRegistry(), cancel)
	if !errors.Is(err, web.ErrDevSignInNotLoopback) {
		t.Fatalf("dev gateway on 0.0.0.0: %v, want ErrDevSignInNotLoopback", err)
	}
}
