package discord_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/transport/chat/chattest"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// The Discord transport passes the chat conformance suite against the
// fake REST API, clicking through its signed interactions endpoint.
func TestConformance(t *testing.T) {
	var f *fakeDiscord
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	chattest.TestTransport(t, chattest.Features{
		Name: discord.Name, User: "111", DM: "DM111", Other: "222",
		Click: func(t *testing.T, url string, prompt chattest.Message, user, option string) {
			calls := f.find(http.MethodPost, "/channels/"+prompt.Channel+"/messages", func(c call) bool { return c.id == prompt.ID })
			if len(calls) != 1 {
				t.Fatalf("no prompt %s: %s", prompt.ID, f.dump())
			}
			in := click(user, where{channel: prompt.Channel, typ: 1}, prompt.ID, customID(t, calls[0], "Approve"))
			if a := signedPost(t, url, key, in, time.Now()); a.status != http.StatusOK {
				t.Fatalf("click: %d", a.status)
			}
		},
	}, func(t *testing.T, js jetstream.JetStream, reg prometheus.Registerer) (chattest.Transport, chattest.Fake) {
		f = newFakeDiscord(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tr, err := discord.New(ctx, discord.Config{
			JS: js, APIURL: f.srv.URL, BotToken: botToken, PublicKey: pub, Logger: pipelinetest.Logger(), Registerer: reg,
		})
		if err != nil {
			t.Fatalf("discord.New: %v", err)
		}
		return tr, f
	})
}

// Messages are the fake's message posts and edits (chattest.Fake), with
// their content and components.
func (f *fakeDiscord) Messages() []chattest.Message {
	var out []chattest.Message
	for _, c := range f.find("", "/channels/", func(c call) bool {
		return c.method == http.MethodPost && strings.HasSuffix(c.path, "/messages") || c.method == http.MethodPatch
	}) {
		b, _ := json.Marshal(c.body["components"])
		m := chattest.Message{Edit: c.method == http.MethodPatch, Channel: c.channel(), ID: c.id, Text: c.content() + "\n" + string(b)}
		if m.Edit {
			m.ID = c.path[strings.LastIndex(c.path, "/")+1:]
		}
		out = append(out, m)
	}
	return out
}
