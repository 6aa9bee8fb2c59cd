package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// `tollgate dev` starts the chat transports whose credentials are set, and
// only those; incomplete credentials stop it at once, naming what is
// missing.
func TestDevStartsTheChatTransportsWhoseCredentialsAreSet(t *testing.T) {
	h := pipelinetest.Start(t, pipelinetest.Options{Stages: []string{}})
	for _, name := range []string{"TOLLGATE_SLACK_BOT_TOKEN", "TOLLGATE_SLACK_APP_TOKEN", "TOLLGATE_DISCORD_BOT_TOKEN", "TOLLGATE_DISCORD_PUBLIC_KEY"} {
		t.Setenv(name, "")
		t.Setenv(name+"_FILE", "")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	free := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}

	if started, err := startDevChat(ctx, h.JS, free(), pipelinetest.Logger(), cancel); err != nil || len(started) != 0 {
		t.Fatalf("no credentials: started %v, %v; want nothing", started, err)
	}
	t.Setenv("TOLLGATE_SLACK_BOT_TOKEN", "xoxb-test")
	if _, err := startDevChat(ctx, h.JS, free(), pipelinetest.Logger(), cancel); err == nil || !strings.Contains(err.Error(), "TOLLGATE_SLACK_APP_TOKEN") {
		t.Fatalf("a Slack bot token without an app token: %v, want an error naming TOLLGATE_SLACK_APP_TOKEN", err)
	}
	t.Setenv("TOLLGATE_SLACK_BOT_TOKEN", "")

	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOLLGATE_DISCORD_BOT_TOKEN", "discord-test")
	t.Setenv("TOLLGATE_DISCORD_PUBLIC_KEY", "abcd")
	if _, err := startDevChat(ctx, h.JS, free(), pipelinetest.Logger(), cancel); err == nil || !strings.Contains(err.Error(), "TOLLGATE_DISCORD_PUBLIC_KEY") {
		t.Fatalf("a short Discord public key: %v, want an error naming it", err)
	}
	t.Setenv("TOLLGATE_DISCORD_PUBLIC_KEY", hex.EncodeToString(pub))
	addr := free()
	started, err := startDevChat(ctx, h.JS, addr, pipelinetest.Logger(), cancel)
	if err != nil || len(started) != 1 || started[0] != "discord" {
		t.Fatalf("Discord credentials: started %v, %v; want discord", started, err)
	}
	// Its interactions endpoint answers a signed PING, and refuses one
	// signed by another key.
	ping := func(k ed25519.PrivateKey) int {
		body := []byte(`{"type":1,"id":"1","application_id":"2","token":"t"}`)
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/discord/interactions", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Signature-Timestamp", ts)
		req.Header.Set("X-Signature-Ed25519", discord.Sign(k, ts, body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	jstest.Eventually(t, 10*time.Second, "the dev Discord endpoint answers a signed PING", func() bool { return ping(key) == http.StatusOK })
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	if code := ping(other); code != http.StatusUnauthorized {
		t.Fatalf("a PING signed by another key: %d, want 401", code)
	}
}
