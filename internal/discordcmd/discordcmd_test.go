package discordcmd

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// Secrets come from <NAME>_FILE first, then <NAME>; both are required; the
// public key must be 32 bytes of hex; there is no flag for any of them.
func TestSecretsComeFromFilesOrTheEnvironment(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "bot")
	if err := os.WriteFile(file, []byte("bot-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(discord.EnvBotToken, "bot-from-env")
	t.Setenv(discord.EnvBotToken+"_FILE", file)
	t.Setenv(discord.EnvPublicKey, hex.EncodeToString(pub))
	c, err := discord.LoadSecrets()
	if err != nil || c.BotToken != "bot-from-file" || !c.PublicKey.Equal(pub) {
		t.Fatalf("secrets: %v", err)
	}
	t.Setenv(discord.EnvPublicKey, "abcd")
	if _, err := discord.LoadSecrets(); err == nil || !strings.Contains(err.Error(), discord.EnvPublicKey) {
		t.Errorf("a short public key: %v", err)
	}
	t.Setenv(discord.EnvPublicKey, hex.EncodeToString(pub))
	t.Setenv(discord.EnvBotToken+"_FILE", filepath.Join(t.TempDir(), "missing"))
	if _, err := discord.LoadSecrets(); err == nil {
		t.Error("an unreadable secret file was accepted")
	}
	for _, flag := range []string{"--bot-token", "--public-key", "--token"} {
		if code := Main(stagecmd.Prog{Name: "discord"}, []string{flag, "x"}); code != 2 {
			t.Errorf("%s is a flag (exit %d); secrets must not be", flag, code)
		}
	}
}
