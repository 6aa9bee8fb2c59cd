// Package discordcmd runs Tollgate's Discord transport (package
// transport/discord) against a NATS server where Tollgate's stages run,
// under its own NATS user (`tollgate discord`, cmd/discord). It serves Discord's interactions endpoint
// (POST /discord/interactions) over HTTP and calls Discord's REST API with
// the bot token; no gateway websocket is needed.
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
	"net"
	"time"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// Component is the Discord transport.
var Component = stagecmd.Component{
	Name:    "discord",
	Summary: "the Discord transport: messages in, approval prompts and decisions in Discord (docs/discord.md)",
	Example: "--http 127.0.0.1:8091 --nats nats://127.0.0.1:4222",
	Main:    Main,
}

// Main runs the transport invoked as p until SIGINT/SIGTERM and returns
// the exit status.
func Main(p stagecmd.Prog, args []string) int {
	fs := p.FlagSet()
	var c stagecmd.Common
	c.RegisterProcess(fs, "127.0.0.1:9467")
	addr := fs.String("http", stagecmd.Env("TOLLGATE_DISCORD_HTTP", "127.0.0.1:8091"), "listen address of /discord/interactions (env TOLLGATE_DISCORD_HTTP)")
	apiURL := fs.String("discord-api-url", stagecmd.Env("TOLLGATE_DISCORD_API_URL", discord.DefaultAPIURL), "Discord REST API root (env TOLLGATE_DISCORD_API_URL)")
	if exit, ok := stagecmd.Parse(fs, p.Help, args); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		return p.Usage("no arguments expected, got %q", fs.Args())
	}
	log := stagecmd.Logger(c.LogLevel)
	sec, err := discord.LoadSecrets()
	if err != nil {
		log.Error("secrets", "err", err)
		return 2
	}
	ctx, cancel := stagecmd.SignalContext()
	defer cancel()
	proc, err := c.Start(ctx, "discord", log, false)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	defer proc.Close()
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	tr, err := discord.New(nctx, discord.Config{
		JS: proc.JS, APIURL: *apiURL, BotToken: sec.BotToken, PublicKey: sec.PublicKey, Logger: log, Registerer: proc.Reg,
	})
	ncancel()
	if err != nil {
		log.Error("discord", "err", err, "hint", "start Tollgate's stages first: they create the streams and buckets")
		return 1
	}
	proc.Ready.Add(health.NATS(proc.NC), health.Check{Name: "discord/consumer", Stage: "discord", Check: func(context.Context) error { return tr.Ready() }})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	log.Info("discord transport running", "addr", ln.Addr().String())
	return stagecmd.Exit(log, stagecmd.Run(ctx, tr.Run, stagecmd.ServeHTTP(ln, tr.Handler())))
}
