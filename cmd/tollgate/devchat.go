package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/slack-go/slack"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/transport/discord"
	tgslack "github.com/tollgate-dev/tollgate/transport/slack"
)

// startDevChat starts, on js, the chat transports whose credentials are
// set in the environment, as their own binaries would (cmd/slack,
// cmd/discord; docs/slack.md, docs/discord.md): Slack in Socket Mode when
// TOLLGATE_SLACK_BOT_TOKEN (or _FILE) is set, which also needs
// TOLLGATE_SLACK_APP_TOKEN; Discord when TOLLGATE_DISCORD_BOT_TOKEN (or
// _FILE) is set, which also needs TOLLGATE_DISCORD_PUBLIC_KEY, serving its
// interactions endpoint (POST /discord/interactions) on discordAddr. They
// run until ctx ends; stop is called if one fails. It returns the names of
// those it started, and fails at once when credentials are incomplete or
// a transport cannot start.
func startDevChat(ctx context.Context, js jetstream.JetStream, discordAddr string, log *slog.Logger, stop func()) ([]string, error) {
	var started []string
	run := func(name string, f func(context.Context) error) {
		go func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				log.Error(name+" transport failed", "err", err)
				stop()
			}
		}()
	}
	if tgslack.Configured() {
		sec, err := tgslack.LoadSecrets("socket")
		if err != nil {
			return started, fmt.Errorf("slack: %w", err)
		}
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		tr, err := tgslack.New(tctx, tgslack.Config{
			JS: js, API: slack.New(sec.BotToken, slack.OptionAppLevelToken(sec.AppToken)), Logger: log.With("transport", "slack"),
		})
		cancel()
		if err != nil {
			return started, fmt.Errorf("slack: %w", err)
		}
		run("slack", tr.Run)
		run("slack", func(ctx context.Context) error { return tr.RunSocketMode(ctx) })
		started = append(started, "slack")
		fmt.Fprintln(os.Stderr, "Slack transport running (Socket Mode)")
	}
	if discord.Configured() {
		sec, err := discord.LoadSecrets()
		if err != nil {
			return started, fmt.Errorf("discord: %w", err)
		}
		ln, err := net.Listen("tcp", discordAddr)
		if err != nil {
			return started, fmt.Errorf("discord: cannot listen on %s for its interactions endpoint (give another --discord-http): %w", discordAddr, err)
		}
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		tr, err := discord.New(tctx, discord.Config{JS: js, BotToken: sec.BotToken, PublicKey: sec.PublicKey, Logger: log.With("transport", "discord")})
		cancel()
		if err != nil {
			ln.Close()
			return started, fmt.Errorf("discord: %w", err)
		}
		srv := httpserve.New(tr.Handler(), httpserve.Limits{}, nil)
		go func() {
			<-ctx.Done()
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			_ = srv.Shutdown(sctx)
		}()
		run("discord", tr.Run)
		run("discord", func(context.Context) error {
			if err := srv.Serve(ln); err != http.ErrServerClosed {
				return err
			}
			return nil
		})
		started = append(started, "discord")
		fmt.Fprintf(os.Stderr, "Discord interactions endpoint on http://%s/discord/interactions\n", ln.Addr())
	}
	return started, nil
}
