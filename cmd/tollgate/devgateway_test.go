package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"github.com/prometheus/client_golang/prometheus"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestDevGatewayServesWithItsDevKey: on first start `tollgate dev` creates
// a keys file holding only the dev key's hash and writes the token (mode
// 0600) to the data directory; the gateway answers that token and no
// request without it; a restart keeps the key.
func TestDevGatewayServesWithItsDevKey(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{Stages: []string{}})
	data := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := runDevGateway(ctx, h.JS, h.Policy, h.Keys, data, addr, "", pipelinetest.Logger(), prometheus.NewRegistry(), cancel); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(data, devTokenFile)
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(b))
	if fi, _ := os.Stat(tokenFile); fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	keys, _ := os.ReadFile(filepath.Join(data, devKeysFile))
	if strings.Contains(string(keys), token[strings.LastIndexByte(token, '_')+1:]) {
		t.Fatal("the keys file holds the secret")
	}
	get := func(tok string) int {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/approvals", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	jstest.Eventually(t, 10*time.Second, "the dev gateway answers its key", func() bool { return get(token) == http.StatusOK })
	if code := get(""); code != http.StatusUnauthorized {
		t.Errorf("without a key: %d, want 401", code)
	}
	if err := runDevGateway(ctx, h.JS, h.Policy, h.Keys, data, addr, "", pipelinetest.Logger(), prometheus.NewRegistry(), cancel); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("a second gateway on %s: %v, want an error naming the address", addr, err)
	}
	again, tok, err := devGatewayKeys(data)
	if err != nil || tok != "" || len(again) != 1 || !strings.HasPrefix(token, "tg_"+again[0].ID+"_") {
		t.Fatalf("second start: %v, token %q, keys %+v: want the first key kept", err, tok, again)
	}
}

// TestDevGatewayDeliversWebhooks: with --webhooks, `tollgate dev`'s gateway
// delivers the file's subscribers their events (here an approval
// requested on the cli transport), signed.
func TestDevGatewayDeliversWebhooks(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{})
	got := make(chan http.Header, 16)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	secret := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	file := filepath.Join(t.TempDir(), "webhooks.json")
	conf := `{"subscribers":[{"id":"dev","url":"` + recv.URL + `","secret":"` + secret + `","transports":["cli"],"events":["approval.requested"]}]}`
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := runDevGateway(ctx, h.JS, h.Policy, h.Keys, t.TempDir(), addr, file, pipelinetest.Logger(), prometheus.NewRegistry(), cancel); err != nil {
		t.Fatal(err)
	}
	// The dispatcher's consumers are made in the background, each starting
	// after the events stored when it is made: send once the subscriber's
	// consumers of the turn logs (its requests: webhook-dev-outcome-<i>)
	// exist.
	jstest.Eventually(t, pipelinetest.Wait, "the subscriber's consumers of the turn logs", func() bool {
		for i := range h.Env.Buckets.TurnLogs {
			if _, err := h.JS.Consumer(context.Background(), topology.TurnLogStream(i), outcomes.Durable("webhook-dev", i)); err != nil {
				return false
			}
		}
		return true
	})
	turn := h.Send(h.Inbound("hooks", "alice", pipelinetest.Call("write_file", `{"path":"hooks.txt","content":"x"}`)))
	h.WaitPending(schemas.ApprovalID(turn, 0))
	select {
	case hdr := <-got:
		if !strings.HasPrefix(hdr.Get("webhook-signature"), "v1,") || hdr.Get("webhook-id") == "" {
			t.Fatalf("delivery headers %v, want a Standard Webhooks signature and id", hdr)
		}
	case <-time.After(pipelinetest.Wait):
		t.Fatal("no webhook delivered for the approval requested")
	}
	if err := runDevGateway(ctx, h.JS, h.Policy, h.Keys, t.TempDir(), "127.0.0.1:0", filepath.Join(t.TempDir(), "missing.json"), pipelinetest.Logger(), prometheus.NewRegistry(), cancel); err == nil || !strings.Contains(err.Error(), "webhooks") {
		t.Fatalf("a missing webhooks file: %v, want an error naming the webhooks", err)
	}
}
