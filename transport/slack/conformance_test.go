package slack_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/transport/chat/chattest"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// The Slack transport passes the chat conformance suite against
// slacktest's fake Web API, clicking through its signed interactivity
// endpoint.
func TestConformance(t *testing.T) {
	var f *fakeSlack
	var clicks atomic.Int64
	chattest.TestTransport(t, chattest.Features{
		Name: tgslack.Name, User: team + ":U1", DM: "DU1", Other: team + ":U2",
		Click: func(t *testing.T, url string, prompt chattest.Message, user, option string) {
			calls := f.find("chat.postMessage", func(c call) bool { return c.ts == prompt.ID })
			if len(calls) != 1 {
				t.Fatalf("no prompt %s among %v", prompt.ID, f.methods())
			}
			_, u, _ := strings.Cut(user, ":")
			body := clickBody(u, prompt.Channel, prompt.ID, tgslack.ActionApprove, buttonValue(t, calls[0], tgslack.ActionApprove),
				fmt.Sprintf("1800000100.%06d", clicks.Add(1)))
			if resp := signedPost(t, url+"/slack/interactivity", form, body, time.Now(), secret); resp.StatusCode != http.StatusOK {
				t.Fatalf("click: %d", resp.StatusCode)
			}
		},
	}, func(t *testing.T, js jetstream.JetStream, reg prometheus.Registerer) (chattest.Transport, chattest.Fake) {
		f = newFakeSlack(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tr, err := tgslack.New(ctx, tgslack.Config{
			JS: js, API: f.api(), SigningSecret: secret, BotUserID: botUser, Logger: pipelinetest.Logger(), Registerer: reg,
		})
		if err != nil {
			t.Fatalf("slack.New: %v", err)
		}
		return tr, f
	})
}

// Messages are the fake's chat.postMessage and chat.update calls
// (chattest.Fake).
func (f *fakeSlack) Messages() []chattest.Message {
	var out []chattest.Message
	for _, c := range f.find("", func(c call) bool { return c.method == "chat.postMessage" || c.method == "chat.update" }) {
		m := chattest.Message{Edit: c.method == "chat.update", Channel: c.form.Get("channel"), ID: c.ts, Text: c.form.Get("text") + "\n" + c.form.Get("blocks")}
		if m.Edit {
			m.ID = c.form.Get("ts")
		}
		out = append(out, m)
	}
	return out
}
