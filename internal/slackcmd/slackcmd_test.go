package slackcmd

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// Secrets come from <NAME>_FILE first, then <NAME>; each mode requires its
// own; there is no flag for any of them.
func TestSecretsComeFromFilesOrTheEnvironment(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bot")
	if err := os.WriteFile(file, []byte("xoxb-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(tgslack.EnvBotToken, "xoxb-from-env")
	t.Setenv(tgslack.EnvBotToken+"_FILE", file)
	t.Setenv(tgslack.EnvAppToken, "xapp-env")
	t.Setenv(tgslack.EnvSigningSecret, "")
	c, err := tgslack.LoadSecrets("socket")
	if err != nil || c.BotToken != "xoxb-from-file" || c.AppToken != "xapp-env" {
		t.Fatalf("socket: %+v, %v", c, err)
	}
	if _, err := tgslack.LoadSecrets("http"); err == nil || !strings.Contains(err.Error(), tgslack.EnvSigningSecret) {
		t.Errorf("http mode without a signing secret: %v", err)
	}
	t.Setenv(tgslack.EnvBotToken+"_FILE", filepath.Join(t.TempDir(), "missing"))
	if _, err := tgslack.LoadSecrets("socket"); err == nil {
		t.Error("an unreadable secret file was accepted")
	}
	for _, flag := range []string{"--bot-token", "--app-token", "--signing-secret", "--token"} {
		if code := Main(stagecmd.Prog{Name: "slack"}, []string{flag, "x"}); code != 2 {
			t.Errorf("%s is a flag (exit %d); secrets must not be", flag, code)
		}
	}
}

// The shipped app manifest turns Socket Mode and interactivity on and
// grants every scope and event the transport uses.
func TestManifestGrantsWhatTheTransportUses(t *testing.T) {
	b, err := os.ReadFile("../../deploy/slack/manifest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		OAuth struct {
			Scopes struct {
				Bot []string `yaml:"bot"`
			} `yaml:"scopes"`
		} `yaml:"oauth_config"`
		Settings struct {
			Events struct {
				Bot []string `yaml:"bot_events"`
			} `yaml:"event_subscriptions"`
			Interactivity struct {
				Enabled bool `yaml:"is_enabled"`
			} `yaml:"interactivity"`
			SocketMode bool `yaml:"socket_mode_enabled"`
		} `yaml:"settings"`
	}
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if !m.Settings.SocketMode || !m.Settings.Interactivity.Enabled {
		t.Errorf("socket mode %v, interactivity %v: both must be on", m.Settings.SocketMode, m.Settings.Interactivity.Enabled)
	}
	for _, s := range []string{"app_mentions:read", "im:history", "channels:history", "groups:history", "mpim:history",
		"chat:write", "im:write", "channels:read", "groups:read", "im:read", "mpim:read"} {
		if !slices.Contains(m.OAuth.Scopes.Bot, s) {
			t.Errorf("scope %s missing", s)
		}
	}
	for _, e := range []string{"app_mention", "message.im", "message.channels", "message.groups", "message.mpim"} {
		if !slices.Contains(m.Settings.Events.Bot, e) {
			t.Errorf("event %s missing", e)
		}
	}
}
