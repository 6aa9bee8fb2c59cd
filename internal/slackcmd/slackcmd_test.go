package slackcmd

import (
	"os"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The command's secrets, flags and exits are tested for every chat
// platform in internal/chatcmd.

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
