package slack

import (
	"fmt"

	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Names of the transport's secrets: environment variables, and <name>_FILE
// names a file holding the secret. Secrets never come from flags and are
// never logged.
const (
	EnvBotToken      = "TOLLGATE_SLACK_BOT_TOKEN"      // xoxb-… (always)
	EnvAppToken      = "TOLLGATE_SLACK_APP_TOKEN"      // xapp-… with connections:write (Socket Mode)
	EnvSigningSecret = "TOLLGATE_SLACK_SIGNING_SECRET" // the app's signing secret (HTTP mode)
)

// Secrets are the Slack credentials of one connection mode.
type Secrets struct {
	BotToken, AppToken, SigningSecret string
}

// Configured reports whether a bot token is set (in the environment or by
// file): whether Slack is meant to run at all.
func Configured() bool { return chat.Configured(EnvBotToken) }

// LoadSecrets reads the secrets mode ("socket" or "http") needs: each from
// the file named by $<name>_FILE (trimmed), else from $<name>
// (chat.RequireSecret). It fails naming the variable when a required one
// is missing or its file cannot be read.
func LoadSecrets(mode string) (Secrets, error) {
	var s Secrets
	var err error
	if s.BotToken, err = chat.RequireSecret(EnvBotToken, ""); err != nil {
		return s, err
	}
	switch mode {
	case "socket":
		s.AppToken, err = chat.RequireSecret(EnvAppToken, " in Socket Mode")
	case "http":
		s.SigningSecret, err = chat.RequireSecret(EnvSigningSecret, " in HTTP mode")
	default:
		err = fmt.Errorf("mode %q: want socket or http", mode)
	}
	return s, err
}
