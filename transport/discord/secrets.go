package discord

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"

	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Names of the transport's secrets: environment variables, and <name>_FILE
// names a file holding the secret. Secrets never come from flags and are
// never logged.
const (
	EnvBotToken  = "TOLLGATE_DISCORD_BOT_TOKEN"
	EnvPublicKey = "TOLLGATE_DISCORD_PUBLIC_KEY" // the application's Ed25519 public key, hex
)

// Secrets are the Discord application's credentials.
type Secrets struct {
	BotToken  string
	PublicKey ed25519.PublicKey
}

// Configured reports whether a bot token is set (in the environment or by
// file): whether Discord is meant to run at all.
func Configured() bool { return chat.Configured(EnvBotToken) }

// LoadSecrets reads the bot token and the public key (chat.RequireSecret). It
// fails naming the variable when one is missing, unreadable, or the key is
// not 32 bytes of hex.
func LoadSecrets() (Secrets, error) {
	var s Secrets
	var err error
	if s.BotToken, err = chat.RequireSecret(EnvBotToken, ""); err != nil {
		return s, err
	}
	k, err := chat.Secret(EnvPublicKey)
	if err != nil {
		return s, err
	}
	b, err := hex.DecodeString(k)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return s, errors.New(EnvPublicKey + " (or " + EnvPublicKey + "_FILE) must be the application's 32-byte public key in hex")
	}
	s.PublicKey = b
	return s, nil
}
