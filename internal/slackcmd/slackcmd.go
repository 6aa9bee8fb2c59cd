// Package slackcmd runs Tollgate's Slack transport (package transport/slack)
// against a NATS server where Tollgate's stages run, under its own NATS
// user (`tollgate slack`, cmd/slack). Socket Mode is the default connection (no public URL needed);
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
package slackcmd

import (
	"context"
	"net"
	"time"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// Component is the Slack transport.
var Component = stagecmd.Component{
	Name:    "slack",
	Summary: "the Slack transport: messages in, approval prompts and decisions in Slack (docs/slack.md)",
	Example: "--mode socket --nats nats://127.0.0.1:4222",
	Main:    Main,
}

// Main runs the transport invoked as p until SIGINT/SIGTERM and returns
// the exit status.
func Main(p stagecmd.Prog, args []string) int {
	fs := p.FlagSet()
	var c stagecmd.Common
	c.RegisterProcess(fs, "127.0.0.1:9468")
	mode := fs.String("mode", stagecmd.Env("TOLLGATE_SLACK_MODE", "socket"), "socket (Socket Mode, outbound websocket) or http (Events API endpoints) (env TOLLGATE_SLACK_MODE)")
	addr := fs.String("http", stagecmd.Env("TOLLGATE_SLACK_HTTP", "127.0.0.1:8090"), "HTTP mode: listen address of /slack/events and /slack/interactivity (env TOLLGATE_SLACK_HTTP)")
	apiURL := fs.String("slack-api-url", stagecmd.Env("TOLLGATE_SLACK_API_URL", slack.APIURL), "Slack Web API root (env TOLLGATE_SLACK_API_URL)")
	if exit, ok := stagecmd.Parse(fs, p.Help, args); !ok {
		return exit
	}
	if fs.NArg() > 0 {
		return p.Usage("no arguments expected, got %q", fs.Args())
	}
	log := stagecmd.Logger(c.LogLevel)
	sec, err := tgslack.LoadSecrets(*mode)
	if err != nil {
		log.Error("secrets", "err", err)
		return 2
	}
	ctx, cancel := stagecmd.SignalContext()
	defer cancel()
	proc, err := c.Start(ctx, "slack", log, false)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	defer proc.Close()
	opts := []slack.Option{slack.OptionAPIURL(*apiURL)}
	if sec.AppToken != "" {
		opts = append(opts, slack.OptionAppLevelToken(sec.AppToken))
	}
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	tr, err := tgslack.New(nctx, tgslack.Config{
		JS: proc.JS, API: slack.New(sec.BotToken, opts...), SigningSecret: sec.SigningSecret, Logger: log, Registerer: proc.Reg,
	})
	ncancel()
	if err != nil {
		log.Error("slack", "err", err, "hint", "start Tollgate's stages first: they create the streams and buckets")
		return 1
	}
	proc.Ready.Add(health.NATS(proc.NC), health.Check{Name: "slack/consumer", Stage: "slack", Check: func(context.Context) error { return tr.Ready() }})
	actors := []func(context.Context) error{tr.Run}
	switch *mode {
	case "socket":
		actors = append(actors, func(ctx context.Context) error { return tr.RunSocketMode(ctx) })
		log.Info("slack transport running", "mode", "socket")
	case "http":
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			log.Error("listen", "err", err)
			return 1
		}
		actors = append(actors, stagecmd.ServeHTTP(ln, tr.Handler()))
		log.Info("slack transport running", "mode", "http", "addr", ln.Addr().String())
	}
	return stagecmd.Exit(log, stagecmd.Run(ctx, actors...))
}
