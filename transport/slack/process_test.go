package slack_test

import (
	"bytes"
	"context"
	"fmt"
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
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
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

// The e2e test: cmd/slack runs as its own process (HTTP mode) against the
// fake Slack and a pipeline on an embedded nats-server. A DM turn with a
// call (published as the planner would give it) gets its prompt in the
// DM; the signed click goes to the process; the call runs; the prompt is
// updated; the result lands in the thread. The secrets reach the process
// through a file and the environment and appear nowhere in its output.
func TestSlackProcessEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs tollgate slack")
	}
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: testPolicy})
	fake := newFakeSlack(t)
	bins, err := childproc.Binaries(context.Background(), t.TempDir(), false, []string{"tollgate"}, "./cmd/tollgate")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(bins, "tollgate") // `tollgate slack`, as cmd/slack runs it
	secretFile := filepath.Join(t.TempDir(), "signing")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "slack", "--mode", "http", "--http", addr, "--metrics", "",
		"--nats", h.Env.Server.ClientURL(), "--slack-api-url", fake.srv.GetAPIURL(), "--log-level", "debug")
	cmd.Env = append(os.Environ(), "TOLLGATE_SLACK_BOT_TOKEN=xoxb-process-secret", "TOLLGATE_SLACK_SIGNING_SECRET_FILE="+secretFile)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		for _, s := range []string{"xoxb-process-secret", secret} {
			if strings.Contains(out.String(), s) {
				t.Errorf("the process logged a secret")
			}
		}
		if t.Failed() {
			t.Logf("process output:\n%s", out.String())
		}
	})
	r := &rig{h: h, slack: fake}
	base := "http://" + addr
	send := func(path, ct string, body []byte) int {
		req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
		now := time.Now().Unix()
		req.Header.Set("Content-Type", ct)
		req.Header.Set("X-Slack-Request-Timestamp", fmt.Sprint(now))
		req.Header.Set("X-Slack-Signature", tgslack.Sign(secret, now, body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	jstest.EventuallyState(t, jstest.LongWait, "the process serves /slack/events", func() (bool, string) {
		code := send("/slack/events", "application/json", []byte(`{"type":"url_verification","challenge":"c"}`))
		return code == 200, fmt.Sprintf("status %d (0: no answer)", code)
	})
	// The consumer is created at start: wait for it before the turn.
	jstest.EventuallyState(t, jstest.Wait, "consumer "+tgslack.Durable, func() (bool, string) {
		cctx, ccancel := h.Ctx()
		defer ccancel()
		_, err := h.JS.Consumer(cctx, "TOLLGATE_EVENTS", tgslack.Durable)
		return err == nil, fmt.Sprint(err)
	})

	const ch, ts = "DU1", "1700000070.000100"
	h.Send(&schemas.InboundMessage{
		Transport: tgslack.Name, MessageID: team + ":" + ch + ":" + ts, SessionID: "slack:" + team + ":" + ch + ":" + ts,
		Sender:  schemas.Sender{ID: team + ":U1", Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: ch, Kind: schemas.ChannelDM, Thread: ts},
		Text:    "write process.txt", Calls: proposeCalls("write process.txt"),
	})
	id := schemas.ApprovalID(turnOf(ch, ts), 0)
	p := r.promptOf(t, id)
	if p.form.Get("channel") != ch {
		t.Fatalf("prompt went to %s", p.form.Get("channel"))
	}
	if code := send("/slack/interactivity", form, clickBody("U1", ch, p.ts, tgslack.ActionApprove, buttonValue(t, p, tgslack.ActionApprove), "7.1")); code != 200 {
		t.Fatalf("click: %d", code)
	}
	r.awaitStatus(t, id, schemas.ApprovalApproved)
	fake.await(t, 1, "chat.update", func(c call) bool {
		return c.form.Get("ts") == p.ts && strings.Contains(c.form.Get("blocks"), "Approved")
	})
	res := fake.await(t, 2, "chat.postMessage", in(ch))[1]
	if res.form.Get("thread_ts") != ts || !strings.Contains(res.form.Get("text"), "write_file") {
		t.Errorf("result: %v", res.form)
	}
	if b, err := os.ReadFile(filepath.Join(h.Sandbox, "process.txt")); err != nil || string(b) != "from slack" {
		t.Errorf("the call did not run: %q %v", b, err)
	}
}
