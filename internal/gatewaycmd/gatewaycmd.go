// Package gatewaycmd runs Tollgate's HTTP gateway (package
// transport/gateway) against a NATS server where Tollgate's stages run:
// the /v1 API for agents, and the web approval inbox when OpenID Connect
// is configured, under its own NATS user. `tollgate gateway` and
// cmd/gateway run it; configure it with flags or TOLLGATE_* environment
// variables (-h lists them).
//
//	tollgate gateway --keys keys.json --http 127.0.0.1:8080
//	tollgate gateway newkey --transport gateway --scopes submit,read,decide --vouch
package gatewaycmd

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
	"github.com/tollgate-dev/tollgate/transport/gateway"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

// Component is the gateway; `gateway newkey` prints a fresh API key.
var Component = scaffold.Component{
	Name: "gateway", Args: "[newkey]",
	Summary: "the HTTP gateway: the /v1 API for agents and the web approval inbox (docs/api.md, docs/inbox.md)",
	Example: "--keys /etc/tollgate/gateway-keys.json --http 127.0.0.1:8080",
	Main:    Main,
}

// Main runs the gateway invoked as p (or, with newkey first, prints a new
// API key) and returns the exit status.
func Main(p scaffold.Prog, args []string) int {
	if len(args) > 0 && args[0] == "newkey" {
		return newKey(scaffold.Prog{Name: p.Name + " newkey", Help: newKeyHelp(p.Name)}, args[1:])
	}
	return serve(p, args)
}

// serve runs the gateway until SIGINT/SIGTERM.
func serve(p scaffold.Prog, args []string) int {
	fs := p.FlagSet()
	var c scaffold.Common
	c.RegisterProcess(fs, "127.0.0.1:9465")
	scaffold.StringVar(fs, &c.PolicyPath, "policy", "TOLLGATE_POLICY", "", "policy JSON file ingest runs with; empty for the built-in policy (env TOLLGATE_POLICY)")
	addr := fs.String("http", scaffold.Env("TOLLGATE_HTTP", "127.0.0.1:8080"), "HTTP listen address (env TOLLGATE_HTTP)")
	webhooksPath := fs.String("webhooks", scaffold.Env("TOLLGATE_WEBHOOKS", ""), "outgoing webhooks file, JSON; empty for none (env TOLLGATE_WEBHOOKS; see docs/api.md)")
	maxStreams := fs.Int("max-streams", 8, "event streams (SSE) one API key, or one person in the inbox, holds open at once")
	keysPath := fs.String("keys", scaffold.Env("TOLLGATE_GATEWAY_KEYS", ""), "API keys file, JSON (required; env TOLLGATE_GATEWAY_KEYS; see docs/api.md)")
	var inbox inboxFlags
	inbox.register(fs)
	scaffold.OTLPFlag(fs, &c.OTLP)
	if exit, ok := scaffold.Parse(fs, p.Help, args); !ok {
		return exit
	}
	if *keysPath == "" || fs.NArg() > 0 {
		return p.Usage("--keys is required, and no arguments")
	}
	log := scaffold.Logger(c.LogLevel)
	keys, err := gateway.LoadKeys(*keysPath)
	if err != nil {
		log.Error("keys", "err", err)
		return 1
	}
	pol, err := policy.Load(c.PolicyPath)
	if err != nil {
		log.Error("policy", "err", err)
		return 1
	}
	ctx, cancel := scaffold.SignalContext()
	defer cancel()
	proc, err := c.Start(ctx, "gateway", log, true)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	defer proc.Close()
	proc.Ready.Add(health.NATS(proc.NC))
	return scaffold.Exit(log, run(ctx, proc, pol, keys, *addr, *webhooksPath, *maxStreams, &inbox))
}

// run builds the gateway on proc and serves it until ctx ends.
func run(ctx context.Context, proc *scaffold.Process, pol *policy.Policy, keys []gateway.Key, addr, webhooksPath string, maxStreams int, inbox *inboxFlags) error {
	js, log := proc.JS, proc.Log
	// One consumer of the events stream serves every live stream of the
	// process: the API's and the inbox's.
	events := eventfeed.New(js, log)
	defer events.Close()
	cfg := gateway.Config{JS: js, Policy: pol, Keys: keys, Addr: addr, Logger: log, Registerer: proc.Reg, Events: events, MaxStreams: maxStreams}
	var err error
	if cfg.Web, err = inbox.handler(js, pol, addr, log, events, maxStreams); err != nil {
		return fmt.Errorf("web inbox: %w", err)
	}
	if webhooksPath != "" {
		wc, err := webhook.LoadConfig(webhooksPath)
		if err != nil {
			return fmt.Errorf("webhooks: %w", err)
		}
		wc.Logger, wc.Registerer = log, proc.Reg
		d, err := webhook.New(js, wc)
		if err != nil {
			return fmt.Errorf("webhooks: %w", err)
		}
		cfg.Webhooks = d
		// Ready only while every subscriber's consumers consume: a gateway
		// whose deliveries stopped is taken out of rotation, not left
		// serving while its subscribers fall behind.
		proc.Ready.Add(health.Check{Name: "gateway/webhooks", Stage: "gateway", Check: func(context.Context) error { return d.Ready() }})
	}
	s, err := gateway.New(cfg)
	if err != nil {
		return fmt.Errorf("gateway (start Tollgate's stages first: they create the streams and buckets): %w", err)
	}
	return s.Run(ctx)
}

// newKeyHelp is the help of `gateway newkey`, invoked from prog.
func newKeyHelp(prog string) string {
	return scaffold.Component{Name: "newkey", Summary: "print a new API key: its token and the entry for the keys file",
		Example: "--transport agents --scopes submit,read --vouch"}.Help(prog + " newkey")
}

// newKey prints a fresh API key: the token (give it to the key's holder;
// it is not stored) and the entry to add to the keys file.
func newKey(p scaffold.Prog, args []string) int {
	fs := p.FlagSet()
	transport := fs.String("transport", "gateway", "transport name the key acts as")
	scopes := fs.String("scopes", "submit,read,decide", "comma-separated scopes: submit, read, decide")
	vouch := fs.Bool("vouch", false, "senders and deciders of this key's requests are verified (the holder authenticates them)")
	if exit, ok := scaffold.Parse(fs, p.Help, args); !ok {
		return exit
	}
	var sc []gateway.Scope
	for _, s := range strings.Split(*scopes, ",") {
		sc = append(sc, gateway.Scope(strings.TrimSpace(s)))
	}
	token, k := gateway.NewKey(*transport, sc, *vouch)
	if err := gateway.ValidateKeys([]gateway.Key{k}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(map[string]any{"token": token, "key": k})
	return 0
}
