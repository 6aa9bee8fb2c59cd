package chatcmd_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/chatcmd"
	"github.com/tollgate-dev/tollgate/internal/discordcmd"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/slackcmd"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/transport/discord"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// secretCase is one chat platform's command in one configuration: the
// flags that select it, the secrets it requires (variable → a valid
// value), and the secrets a malformed value of which it refuses.
type secretCase struct {
	name      string
	cmd       chatcmd.Command
	args      []string
	secrets   map[string]string
	malformed map[string]string
	// flags are secret-looking flags that must not exist.
	flags []string
}

func secretCases(t *testing.T) []secretCase {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return []secretCase{
		{
			name: "slack socket", cmd: slackcmd.Command, args: []string{"--mode", "socket"},
			secrets: map[string]string{tgslack.EnvBotToken: "xoxb-1", tgslack.EnvAppToken: "xapp-1"},
			flags:   []string{"--bot-token", "--app-token", "--signing-secret", "--token"},
		},
		{
			name: "slack http", cmd: slackcmd.Command, args: []string{"--mode", "http"},
			secrets: map[string]string{tgslack.EnvBotToken: "xoxb-1", tgslack.EnvSigningSecret: "signing"},
			flags:   []string{"--bot-token", "--signing-secret", "--token"},
		},
		{
			name: "discord", cmd: discordcmd.Command,
			secrets:   map[string]string{discord.EnvBotToken: "bot-1", discord.EnvPublicKey: hex.EncodeToString(pub)},
			malformed: map[string]string{discord.EnvPublicKey: "abcd"},
			flags:     []string{"--bot-token", "--public-key", "--token"},
		},
	}
}

// setSecrets sets each secret's variable to its value (and clears its
// _FILE), and clears every other secret variable of the platforms.
func setSecrets(t *testing.T, secrets map[string]string) {
	for _, v := range []string{tgslack.EnvBotToken, tgslack.EnvAppToken, tgslack.EnvSigningSecret, discord.EnvBotToken, discord.EnvPublicKey} {
		t.Setenv(v, secrets[v])
		t.Setenv(v+"_FILE", "")
	}
}

// load parses args with c's platform part, as Main does, and loads its
// secrets.
func load(t *testing.T, c chatcmd.Command, args []string) error {
	t.Helper()
	p := c.Platform()
	fs := flag.NewFlagSet(c.Name, flag.ContinueOnError)
	p.Flags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return p.LoadSecrets()
}

// Secrets come from <NAME>_FILE first (trimmed), then <NAME>; each one
// the configuration requires is refused, naming its variable, when it is
// missing or malformed; an unreadable file is refused even when the
// variable is set; no secret is a flag, and a command without its secrets
// exits 2 before it connects.
func TestSecretsComeFromFilesOrTheEnvironment(t *testing.T) {
	for _, tc := range secretCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			setSecrets(t, tc.secrets)
			if err := load(t, tc.cmd, tc.args); err != nil {
				t.Fatalf("every secret set: %v", err)
			}
			for v, val := range tc.secrets {
				setSecrets(t, tc.secrets)
				t.Setenv(v, "")
				if err := load(t, tc.cmd, tc.args); err == nil || !strings.Contains(err.Error(), v) {
					t.Errorf("without %s: %v", v, err)
				}
				file := filepath.Join(t.TempDir(), "secret")
				if err := os.WriteFile(file, []byte(val+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				t.Setenv(v+"_FILE", file)
				if err := load(t, tc.cmd, tc.args); err != nil {
					t.Errorf("%s from %s_FILE: %v", v, v, err)
				}
				t.Setenv(v, val)
				t.Setenv(v+"_FILE", filepath.Join(t.TempDir(), "missing"))
				if err := load(t, tc.cmd, tc.args); err == nil || !strings.Contains(err.Error(), v+"_FILE") {
					t.Errorf("%s_FILE unreadable, %s set: %v", v, v, err)
				}
			}
			for v, bad := range tc.malformed {
				setSecrets(t, tc.secrets)
				t.Setenv(v, bad)
				if err := load(t, tc.cmd, tc.args); err == nil || !strings.Contains(err.Error(), v) {
					t.Errorf("%s=%q: %v", v, bad, err)
				}
			}
			setSecrets(t, tc.secrets)
			for _, flag := range tc.flags {
				if code := tc.cmd.Main(scaffold.Prog{Name: tc.cmd.Name}, append([]string{flag, "x"}, tc.args...)); code != 2 {
					t.Errorf("%s is a flag (exit %d); secrets must not be", flag, code)
				}
			}
			setSecrets(t, nil)
			// A NATS URL nothing answers: the exit must come before connecting.
			if code := tc.cmd.Main(scaffold.Prog{Name: tc.cmd.Name}, append([]string{"--nats", "nats://" + freeAddr(t), "--metrics", ""}, tc.args...)); code != 2 {
				t.Errorf("without secrets: exit %d, want 2", code)
			}
		})
	}
}

// Both platforms' commands: -h exits 0, an argument or a malformed
// TOLLGATE_* value exits 2, Slack refuses an unknown mode with 2.
func TestUsageExits(t *testing.T) {
	cases := []struct {
		name string
		cmd  chatcmd.Command
		args []string
		env  map[string]string
		want int
	}{
		{"slack -h", slackcmd.Command, []string{"-h"}, nil, 0},
		{"discord -h", discordcmd.Command, []string{"-h"}, nil, 0},
		{"slack argument", slackcmd.Command, []string{"extra"}, nil, 2},
		{"discord argument", discordcmd.Command, []string{"extra"}, nil, 2},
		{"slack bad log level", slackcmd.Command, nil, map[string]string{"TOLLGATE_LOG_LEVEL": "loud"}, 2},
		{"discord bad log level", discordcmd.Command, nil, map[string]string{"TOLLGATE_LOG_LEVEL": "loud"}, 2},
		{"slack unknown mode", slackcmd.Command, []string{"--mode", "carrier-pigeon"}, map[string]string{tgslack.EnvBotToken: "xoxb-1"}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			setSecrets(t, nil)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := tc.cmd.Main(scaffold.Prog{Name: tc.cmd.Name}, tc.args); got != tc.want {
				t.Errorf("exit %d, want %d", got, tc.want)
			}
		})
	}
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := embedded.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// fake is a platform part whose transport does nothing: its consumer
// runs until the process stops, its handler answers 418.
type fake struct {
	newErr error
	served chatcmd.Served
}

func (f *fake) Flags(*flag.FlagSet) {}
func (f *fake) LoadSecrets() error  { return nil }
func (f *fake) New(context.Context, chatcmd.Deps) (chatcmd.Served, error) {
	s := f.served
	s.Transport = fakeTransport{}
	return s, f.newErr
}

type fakeTransport struct{}

func (fakeTransport) Run(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
func (fakeTransport) Ready() error                  { return nil }
func (fakeTransport) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
}

// The process a platform's part runs in, against a real nats-server: the
// platform's HTTP handler is served on its address beside its loops; a
// transport that cannot be built, an address that cannot be listened on
// or a loop that fails exits 1; a loop that ends cleanly stops the
// process with 0.
func TestTheProcessRunsThePlatform(t *testing.T) {
	env := jstest.Start(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	served := freeAddr(t)
	// getTeapot is a loop that asks the handler on served once and
	// returns nil when it answered. The process listens before it runs
	// its loops, so the connection is accepted however they interleave.
	getTeapot := func(ctx context.Context) error {
		r, err := http.Get("http://" + served + "/slack/events")
		if err != nil {
			return err
		}
		r.Body.Close()
		if r.StatusCode != http.StatusTeapot {
			return errors.New(r.Status)
		}
		return nil
	}
	cases := []struct {
		name string
		f    *fake
		want int
	}{
		{"served", &fake{served: chatcmd.Served{HTTP: served, Loops: []func(context.Context) error{getTeapot}}}, 0},
		{"a loop ends cleanly", &fake{served: chatcmd.Served{Loops: []func(context.Context) error{func(context.Context) error { return nil }}}}, 0},
		{"a loop fails", &fake{served: chatcmd.Served{Loops: []func(context.Context) error{func(context.Context) error { return errors.New("socket closed") }}}}, 1},
		{"not built", &fake{newErr: errors.New("no approvals bucket")}, 1},
		{"address in use", &fake{served: chatcmd.Served{HTTP: busy.Addr().String()}}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := chatcmd.Command{Name: "fake", Summary: "a fake platform", MetricsAddr: "", Platform: func() chatcmd.Platform { return tc.f }}
			if got := c.Main(scaffold.Prog{Name: "fake"}, []string{"--nats", env.Server.ClientURL(), "--metrics", ""}); got != tc.want {
				t.Errorf("exit %d, want %d", got, tc.want)
			}
		})
	}
}
