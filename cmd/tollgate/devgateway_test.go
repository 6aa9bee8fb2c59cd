package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/pipeline/pipelinetest"
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
	if err := runDevGateway(ctx, h.JS, h.Policy, h.Keys, data, addr, pipelinetest.Logger(), cancel); err != nil {
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
	if err := runDevGateway(ctx, h.JS, h.Policy, h.Keys, data, addr, pipelinetest.Logger(), cancel); err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("a second gateway on %s: %v, want an error naming the address", addr, err)
	}
	again, tok, err := devGatewayKeys(data)
	if err != nil || tok != "" || len(again) != 1 || !strings.HasPrefix(token, "tg_"+again[0].ID+"_") {
		t.Fatalf("second start: %v, token %q, keys %+v: want the first key kept", err, tok, again)
	}
}
