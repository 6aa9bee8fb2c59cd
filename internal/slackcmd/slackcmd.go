// Package slackcmd runs Tollgate's Slack transport (package transport/slack)
// against a NATS server where Tollgate's stages run, under its own NATS
// user (`tollgate slack`, cmd/slack). Socket Mode is the default connection (no public URL needed);
// --mode http serves the Events API and interactivity endpoints instead.
// The process is internal/chatcmd's; this package holds Slack's part.
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
	"flag"

	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/internal/chatcmd"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// Command is the Slack transport's command.
var Command = chatcmd.Command{
	Name:        "slack",
	Summary:     "the Slack transport: messages in, approval prompts and decisions in Slack (docs/slack.md)",
	Example:     "--mode socket --nats nats://127.0.0.1:4222",
	MetricsAddr: "127.0.0.1:9468",
	Platform:    func() chatcmd.Platform { return &platform{} },
}

// Component is the Slack transport (`tollgate slack`, cmd/slack).
var Component = Command.Component()

// platform is Slack's part of the command: its flags and secrets.
type platform struct {
	mode, addr, apiURL string
	sec                tgslack.Secrets
}

func (s *platform) Flags(fs *flag.FlagSet) {
	fs.StringVar(&s.mode, "mode", scaffold.Env("TOLLGATE_SLACK_MODE", "socket"), "socket (Socket Mode, outbound websocket) or http (Events API endpoints) (env TOLLGATE_SLACK_MODE)")
	fs.StringVar(&s.addr, "http", scaffold.Env("TOLLGATE_SLACK_HTTP", "127.0.0.1:8090"), "HTTP mode: listen address of /slack/events and /slack/interactivity (env TOLLGATE_SLACK_HTTP)")
	fs.StringVar(&s.apiURL, "slack-api-url", scaffold.Env("TOLLGATE_SLACK_API_URL", slack.APIURL), "Slack Web API root (env TOLLGATE_SLACK_API_URL)")
}

// LoadSecrets reads the secrets of the --mode (tgslack.LoadSecrets); an
// unknown mode is refused there too.
func (s *platform) LoadSecrets() (err error) {
	s.sec, err = tgslack.LoadSecrets(s.mode)
	return err
}

func (s *platform) New(ctx context.Context, d chatcmd.Deps) (chatcmd.Served, error) {
	opts := []slack.Option{slack.OptionAPIURL(s.apiURL)}
	if s.sec.AppToken != "" {
		opts = append(opts, slack.OptionAppLevelToken(s.sec.AppToken))
	}
	tr, err := tgslack.New(ctx, tgslack.Config{
		JS: d.JS, API: slack.New(s.sec.BotToken, opts...), SigningSecret: s.sec.SigningSecret, Logger: d.Logger, Registerer: d.Registerer,
	})
	if err != nil {
		return chatcmd.Served{}, err
	}
	if s.mode == "socket" {
		return chatcmd.Served{Transport: tr, Loops: []func(context.Context) error{func(ctx context.Context) error { return tr.RunSocketMode(ctx) }},
			Log: []any{"mode", "socket"}}, nil
	}
	return chatcmd.Served{Transport: tr, HTTP: s.addr, Log: []any{"mode", "http"}}, nil
}
