// Command discord runs Tollgate's Discord transport (package
// transport/discord) against a NATS server where Tollgate's stages run,
// under its own NATS user. It serves Discord's interactions endpoint
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
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/transport/chat"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

func main() { os.Exit(serve(os.Args[1:])) }

// serve runs the transport until SIGINT/SIGTERM.
func serve(args []string) int {
	fs := flag.NewFlagSet("discord", flag.ContinueOnError)
	natsURL := fs.String("nats", stagecmd.Env("TOLLGATE_NATS_URL", stagecmd.DefaultNATSURL), "NATS URL (env TOLLGATE_NATS_URL)")
	creds := fs.String("creds", stagecmd.Env("TOLLGATE_NATS_CREDS", ""), "NATS credentials file of the discord user (env TOLLGATE_NATS_CREDS)")
	var account stagecmd.Account
	account.Register(fs)
	logLevel := fs.String("log-level", stagecmd.Env("TOLLGATE_LOG_LEVEL", "info"), "debug, info, warn or error (env TOLLGATE_LOG_LEVEL)")
	addr := fs.String("http", stagecmd.Env("TOLLGATE_DISCORD_HTTP", "127.0.0.1:8091"), "listen address of /discord/interactions (env TOLLGATE_DISCORD_HTTP)")
	apiURL := fs.String("discord-api-url", stagecmd.Env("TOLLGATE_DISCORD_API_URL", discord.DefaultAPIURL), "Discord REST API root (env TOLLGATE_DISCORD_API_URL)")
	metricsAddr := fs.String("metrics", stagecmd.Env("TOLLGATE_METRICS_ADDR", "127.0.0.1:9467"), "address for /metrics, /healthz and /readyz, empty to disable (env TOLLGATE_METRICS_ADDR)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "discord: no arguments")
		return 2
	}
	log := stagecmd.Logger(*logLevel)
	sec, err := discord.LoadSecrets()
	if err != nil {
		log.Error("secrets", "err", err)
		return 2
	}
	nc, js, err := account.Connect(*natsURL, *creds, "tollgate-discord", log, nats.RetryOnFailedConnect(true))
	if err != nil {
		log.Error("connect", "err", err)
		return 1
	}
	defer nc.Drain()
	ctx, cancel := stagecmd.SignalContext()
	defer cancel()
	reg := stagecmd.NewRegistry()
	ready, err := health.New(reg, "discord")
	if err != nil {
		log.Error("health", "err", err)
		return 1
	}
	if err := stagecmd.ServeMetrics(ctx, *metricsAddr, reg, ready, log); err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	tr, err := discord.New(nctx, discord.Config{
		JS: js, APIURL: *apiURL, BotToken: sec.BotToken, PublicKey: sec.PublicKey, Logger: log, Registerer: reg,
	})
	ncancel()
	if err != nil {
		log.Error("discord", "err", err, "hint", "start Tollgate's stages first: they create the streams and buckets")
		return 1
	}
	ready.Add(health.NATS(nc), health.Check{Name: "discord/consumer", Stage: "discord", Check: func(context.Context) error { return tr.Ready() }})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	log.Info("discord transport running", "addr", ln.Addr().String())
	if err := chat.Serve(ctx, tr.Handler(), ln, tr.Run); err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	return 0
}
