// Command slack runs Tollgate's Slack transport (package transport/slack)
// against a NATS server where Tollgate's stages run, under its own NATS
// user. Socket Mode is the default connection (no public URL needed);
// --mode http serves the Events API and interactivity endpoints instead.
//
// Secrets never come from flags and are never logged: each is read from
// the file named by <NAME>_FILE, else from the environment variable
// <NAME>:
//
//	TOLLGATE_SLACK_BOT_TOKEN        xoxb-… (always)
//	TOLLGATE_SLACK_APP_TOKEN        xapp-… with connections:write (Socket Mode)
//	TOLLGATE_SLACK_SIGNING_SECRET   the app's signing secret (HTTP mode)
//
// See docs/slack.md for the set-up.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/transport/chat"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

func main() { os.Exit(serve(os.Args[1:])) }

// serve runs the transport until SIGINT/SIGTERM.
func serve(args []string) int {
	fs := flag.NewFlagSet("slack", flag.ContinueOnError)
	natsURL := fs.String("nats", stagecmd.Env("TOLLGATE_NATS_URL", stagecmd.DefaultNATSURL), "NATS URL (env TOLLGATE_NATS_URL)")
	creds := fs.String("creds", stagecmd.Env("TOLLGATE_NATS_CREDS", ""), "NATS credentials file of the slack user (env TOLLGATE_NATS_CREDS)")
	var account stagecmd.Account
	account.Register(fs)
	logLevel := fs.String("log-level", stagecmd.Env("TOLLGATE_LOG_LEVEL", "info"), "debug, info, warn or error (env TOLLGATE_LOG_LEVEL)")
	mode := fs.String("mode", stagecmd.Env("TOLLGATE_SLACK_MODE", "socket"), "socket (Socket Mode, outbound websocket) or http (Events API endpoints) (env TOLLGATE_SLACK_MODE)")
	addr := fs.String("http", stagecmd.Env("TOLLGATE_SLACK_HTTP", "127.0.0.1:8090"), "HTTP mode: listen address of /slack/events and /slack/interactivity (env TOLLGATE_SLACK_HTTP)")
	apiURL := fs.String("slack-api-url", stagecmd.Env("TOLLGATE_SLACK_API_URL", slack.APIURL), "Slack Web API root (env TOLLGATE_SLACK_API_URL)")
	metricsAddr := fs.String("metrics", stagecmd.Env("TOLLGATE_METRICS_ADDR", "127.0.0.1:9468"), "address for /metrics, /healthz and /readyz, empty to disable (env TOLLGATE_METRICS_ADDR)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "slack: no arguments")
		return 2
	}
	log := stagecmd.Logger(*logLevel)
	sec, err := tgslack.LoadSecrets(*mode)
	if err != nil {
		log.Error("secrets", "err", err)
		return 2
	}
	nc, js, err := account.Connect(*natsURL, *creds, "tollgate-slack", log, nats.RetryOnFailedConnect(true))
	if err != nil {
		log.Error("connect", "err", err)
		return 1
	}
	defer nc.Drain()
	ctx, cancel := stagecmd.SignalContext()
	defer cancel()
	reg := stagecmd.NewRegistry()
	ready, err := health.New(reg, "slack")
	if err != nil {
		log.Error("health", "err", err)
		return 1
	}
	if err := stagecmd.ServeMetrics(ctx, *metricsAddr, reg, ready, log); err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	opts := []slack.Option{slack.OptionAPIURL(*apiURL)}
	if sec.AppToken != "" {
		opts = append(opts, slack.OptionAppLevelToken(sec.AppToken))
	}
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	tr, err := tgslack.New(nctx, tgslack.Config{
		JS: js, API: slack.New(sec.BotToken, opts...), SigningSecret: sec.SigningSecret, Logger: log, Registerer: reg,
	})
	ncancel()
	if err != nil {
		log.Error("slack", "err", err, "hint", "start Tollgate's stages first: they create the streams and buckets")
		return 1
	}
	ready.Add(health.NATS(nc), health.Check{Name: "slack/consumer", Stage: "slack", Check: func(context.Context) error { return tr.Ready() }})

	loops := []func(context.Context) error{tr.Run}
	var ln net.Listener
	switch *mode {
	case "socket":
		loops = append(loops, func(ctx context.Context) error { return tr.RunSocketMode(ctx) })
		log.Info("slack transport running", "mode", "socket")
	case "http":
		if ln, err = net.Listen("tcp", *addr); err != nil {
			log.Error("listen", "err", err)
			return 1
		}
		log.Info("slack transport running", "mode", "http", "addr", ln.Addr().String())
	}
	if err := chat.Serve(ctx, tr.Handler(), ln, loops...); err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	return 0
}
