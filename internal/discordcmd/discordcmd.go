// Package discordcmd runs Tollgate's Discord transport (package
// transport/discord) against a NATS server where Tollgate's stages run,
// under its own NATS user (`tollgate discord`, cmd/discord). It serves Discord's interactions endpoint
// (POST /discord/interactions) over HTTP and calls Discord's REST API with
// the bot token; no gateway websocket is needed. The process is
// internal/chatcmd's; this package holds Discord's part.
//
// Secrets never come from flags and are never logged: each is read from
// the file named by <NAME>_FILE, else from the environment variable
// <NAME>:
//
//	TOLLGATE_DISCORD_BOT_TOKEN    the bot's token
//	TOLLGATE_DISCORD_PUBLIC_KEY   the application's public key (hex)
//
// See docs/discord.md for the set-up.
package discordcmd

import (
	"context"
	"flag"

	"github.com/tollgate-dev/tollgate/internal/chatcmd"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// Command is the Discord transport's command.
var Command = chatcmd.Command{
	Name:        "discord",
	Summary:     "the Discord transport: messages in, approval prompts and decisions in Discord (docs/discord.md)",
	Example:     "--http 127.0.0.1:8091 --nats nats://127.0.0.1:4222",
	MetricsAddr: "127.0.0.1:9467",
	Platform:    func() chatcmd.Platform { return &platform{} },
}

// Component is the Discord transport (`tollgate discord`, cmd/discord).
var Component = Command.Component()

// platform is Discord's part of the command: its flags and secrets.
type platform struct {
	addr, apiURL string
	sec          discord.Secrets
}

func (d *platform) Flags(fs *flag.FlagSet) {
	fs.StringVar(&d.addr, "http", scaffold.Env("TOLLGATE_DISCORD_HTTP", "127.0.0.1:8091"), "listen address of /discord/interactions (env TOLLGATE_DISCORD_HTTP)")
	fs.StringVar(&d.apiURL, "discord-api-url", scaffold.Env("TOLLGATE_DISCORD_API_URL", discord.DefaultAPIURL), "Discord REST API root (env TOLLGATE_DISCORD_API_URL)")
}

// LoadSecrets reads the bot token and the public key (discord.LoadSecrets).
func (d *platform) LoadSecrets() (err error) {
	d.sec, err = discord.LoadSecrets()
	return err
}

func (d *platform) New(ctx context.Context, deps chatcmd.Deps) (chatcmd.Served, error) {
	tr, err := discord.New(ctx, discord.Config{
		JS: deps.JS, APIURL: d.apiURL, BotToken: d.sec.BotToken, PublicKey: d.sec.PublicKey, Logger: deps.Logger, Registerer: deps.Registerer,
	})
	if err != nil {
		return chatcmd.Served{}, err
	}
	return chatcmd.Served{Transport: tr, HTTP: d.addr}, nil
}
