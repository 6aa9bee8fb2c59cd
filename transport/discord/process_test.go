package discord_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// The e2e test: cmd/discord runs as its own process against the fake
// Discord and a pipeline on an embedded nats-server. /ask in a DM gets its
// prompt in the DM; the signed click goes to the process; the call runs;
// the prompt is closed; the result lands in the DM. The secrets reach the
// process through a file and the environment and appear nowhere in its
// output; /healthz and /readyz answer.
func TestDiscordProcessEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs tollgate discord")
	}
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: testPolicy})
	fake := newFakeDiscord(t)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	bins, err := childproc.Binaries(context.Background(), t.TempDir(), false, []string{"tollgate"}, "./cmd/tollgate")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(bins, "tollgate") // `tollgate discord`, as cmd/discord runs it
	const token = "bot-process-secret"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, metrics := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "discord", "--http", addr, "--metrics", metrics,
		"--nats", h.Env.Server.ClientURL(), "--discord-api-url", fake.srv.URL, "--log-level", "debug")
	cmd.Env = append(os.Environ(), "TOLLGATE_DISCORD_BOT_TOKEN_FILE="+tokenFile, "TOLLGATE_DISCORD_PUBLIC_KEY="+hex.EncodeToString(pub))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if strings.Contains(out.String(), token) {
			t.Errorf("the process logged the bot token")
		}
		if t.Failed() {
			t.Logf("process output:\n%s", out.String())
		}
	})
	base := "http://" + addr
	jstest.EventuallyState(t, jstest.LongWait, "the process becomes ready", func() (bool, string) {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, "/readyz " + resp.Status
	})
	if resp, err := http.Get("http://" + metrics + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz: %v", err)
	} else {
		resp.Body.Close()
	}
	if a := signedPost(t, base, key, []byte(`{"id": "1", "type": 1, "application_id": "4000"}`), time.Now()); a.typ != 1 {
		t.Fatalf("PING: %+v", a)
	}

	// /ask reaches the pipeline through the process: the process maps no
	// text to calls (the planner would), so the turn completes empty and
	// its outcome is posted back.
	body, askID := ask("111", dmOf("111"), "hello")
	if a := signedPost(t, base, key, body, time.Now()); a.status != 200 || a.typ != 4 {
		t.Fatalf("/ask: %+v", a)
	}
	fake.await(t, 1, http.MethodPost, "/channels/DM111/messages", func(c call) bool {
		return strings.Contains(c.content(), schemas.TurnID(discord.Name, askID))
	})
	// A turn with a call, published as the planner would give it.
	const ixID = "1299999999999990001"
	h.Send(&schemas.InboundMessage{
		Transport: discord.Name, MessageID: ixID, SessionID: "discord:DM111:" + ixID,
		Sender:  schemas.Sender{ID: "111", Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "DM111", Kind: schemas.ChannelDM},
		Text:    "write process.txt", Calls: proposeCalls("write process.txt"),
	})
	id := schemas.ApprovalID(schemas.TurnID(discord.Name, ixID), 0)
	r := &rig{h: h, discord: fake}
	p := r.promptOf(t, id)
	if p.channel() != "DM111" || p.auth != "Bot "+token {
		t.Fatalf("prompt went to %s", p.channel())
	}
	a := signedPost(t, base, key, click("111", dmOf("111"), p.id, customID(t, p, "Approve")), time.Now())
	if a.status != 200 {
		t.Fatalf("click: %d", a.status)
	}
	r.awaitStatus(t, id, schemas.ApprovalApproved)
	if a.typ != 7 {
		fake.await(t, 1, http.MethodPatch, "/channels/DM111/messages/"+p.id, func(c call) bool { return strings.Contains(c.content(), "Approved") })
	} else if !strings.Contains(a.content(), "Approved") {
		t.Errorf("UPDATE_MESSAGE: %v", a.data)
	}
	res := fake.await(t, 3, http.MethodPost, "/channels/DM111/messages", nil)[2]
	if !strings.Contains(res.content(), "write_file") {
		t.Errorf("result: %s", res.content())
	}
	if b, err := os.ReadFile(filepath.Join(h.Sandbox, "process.txt")); err != nil || string(b) != "from discord" {
		t.Errorf("the call did not run: %q %v", b, err)
	}
}
