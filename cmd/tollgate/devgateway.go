package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
	"github.com/tollgate-dev/tollgate/transport/gateway"
	"github.com/tollgate-dev/tollgate/transport/web"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

// Files of the dev gateway's key in the data directory.
const (
	devKeysFile  = "gateway-keys.json" // the keys file (hashes only)
	devTokenFile = "gateway-dev-key"   // the dev key's token, mode 0600
)

// devGatewayKeys loads <data>/gateway-keys.json, creating it on first
// start with one key for transport "gateway" with every scope, vouching
// for its senders (a laptop: whoever holds the token is the user), whose
// token it writes to <data>/gateway-dev-key (mode 0600) and returns.
func devGatewayKeys(data string) (keys []gateway.Key, token string, err error) {
	keysPath := filepath.Join(data, devKeysFile)
	keys, err = gateway.LoadKeys(keysPath)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return keys, "", err
	}
	token, k := gateway.NewKey("gateway", []gateway.Scope{gateway.ScopeSubmit, gateway.ScopeRead, gateway.ScopeDecide}, true)
	k.Note = "tollgate dev key"
	b, err := json.MarshalIndent(gateway.KeysFile{Keys: []gateway.Key{k}}, "", "  ")
	if err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(data, devTokenFile), []byte(token+"\n"), 0o600); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(keysPath, append(b, '\n'), 0o600); err != nil {
		return nil, "", err
	}
	return []gateway.Key{k}, token, nil
}

// runDevGateway listens on addr (failing at once if it cannot) and serves
// the gateway there until ctx ends, with the web inbox at / and its dev
// sign-in on (web.New refuses that unless addr is a loopback address);
// stop is called if it fails. With webhooksPath set, the gateway also
// delivers the outgoing webhooks that file configures (docs/api.md).
func runDevGateway(ctx context.Context, js jetstream.JetStream, pol *policy.Policy, seals *seal.KeyRing, data, addr, webhooksPath string, log *slog.Logger, reg prometheus.Registerer, stop func()) error {
	keys, token, err := devGatewayKeys(data)
	if err != nil {
		return fmt.Errorf("gateway keys: %w", err)
	}
	// One consumer of the events stream serves the API's and the inbox's
	// live streams.
	events := eventfeed.New(js, log)
	inbox, err := web.New(web.Config{JS: js, Policy: pol, Keys: seals, Logger: log, Addr: addr, DevSignIn: true, Events: events})
	if err != nil {
		return fmt.Errorf("web inbox: %w", err)
	}
	cfg := gateway.Config{JS: js, Policy: pol, Keys: keys, Addr: addr, Logger: log, Registerer: reg, Web: inbox, Events: events}
	if webhooksPath != "" {
		wc, err := webhook.LoadConfig(webhooksPath)
		if err != nil {
			return fmt.Errorf("webhooks: %w", err)
		}
		wc.Logger = log
		if cfg.Webhooks, err = webhook.New(js, wc); err != nil {
			return fmt.Errorf("webhooks: %w", err)
		}
	}
	s, err := gateway.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s for the HTTP gateway (give another --http, or --http '' for none): %w", addr, err)
	}
	if token != "" {
		fmt.Fprintf(os.Stderr, "created the gateway dev key (also in %s):\n  %s\n", filepath.Join(data, devTokenFile), token)
	}
	fmt.Fprintf(os.Stderr, "HTTP API on http://%s/v1 (key: %s)\n", addr, filepath.Join(data, devTokenFile))
	fmt.Fprintf(os.Stderr, "approval inbox on http://%s/ (dev sign-in: pick who you are)\n", addr)
	go func() {
		if err := s.Serve(ctx, ln); err != nil {
			log.Error("gateway failed", "err", err)
			stop()
		}
	}()
	return nil
}
