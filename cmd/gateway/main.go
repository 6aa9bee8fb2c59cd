// Command gateway runs Tollgate's HTTP gateway (package
// transport/gateway) against a NATS server where Tollgate's stages run:
// the /v1 API for agents, under its own NATS user. Configure it with flags
// or TOLLGATE_* environment variables (run with -h for the list).
//
//	gateway --keys keys.json --http 127.0.0.1:8080
//	gateway newkey --transport gateway --scopes submit,read,decide --vouch
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/health"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
	"github.com/tollgate-dev/tollgate/transport/gateway"
	"github.com/tollgate-dev/tollgate/transport/webhook"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "newkey" {
		os.Exit(newKey(os.Args[2:]))
	}
	os.Exit(serve(os.Args[1:]))
}

// serve runs the gateway until SIGINT/SIGTERM.
func serve(args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	natsURL := fs.String("nats", stagecmd.Env("TOLLGATE_NATS_URL", stagecmd.DefaultNATSURL), "NATS URL (env TOLLGATE_NATS_URL)")
	creds := fs.String("creds", stagecmd.Env("TOLLGATE_NATS_CREDS", ""), "NATS credentials file of the gateway user (env TOLLGATE_NATS_CREDS)")
	var account stagecmd.Account // --inbox-prefix, --js-api-prefix: the gateway's own NATS account
	account.Register(fs)
	logLevel := fs.String("log-level", stagecmd.Env("TOLLGATE_LOG_LEVEL", "info"), "debug, info, warn or error (env TOLLGATE_LOG_LEVEL)")
	policyPath := fs.String("policy", stagecmd.Env("TOLLGATE_POLICY", ""), "policy JSON file ingest runs with; empty for the built-in policy (env TOLLGATE_POLICY)")
	addr := fs.String("http", stagecmd.Env("TOLLGATE_HTTP", "127.0.0.1:8080"), "HTTP listen address (env TOLLGATE_HTTP)")
	webhooksPath := fs.String("webhooks", stagecmd.Env("TOLLGATE_WEBHOOKS", ""), "outgoing webhooks file, JSON; empty for none (env TOLLGATE_WEBHOOKS; see docs/api.md)")
	metricsAddr := fs.String("metrics", stagecmd.Env("TOLLGATE_METRICS_ADDR", "127.0.0.1:9465"), "address for /metrics, /healthz and /readyz, empty to disable (env TOLLGATE_METRICS_ADDR)")
	maxStreams := fs.Int("max-streams", 8, "event streams (SSE) one API key, or one person in the inbox, holds open at once")
	keysPath := fs.String("keys", stagecmd.Env("TOLLGATE_GATEWAY_KEYS", ""), "API keys file, JSON (required; env TOLLGATE_GATEWAY_KEYS; see docs/api.md)")
	var inbox inboxFlags
	inbox.register(fs)
	var otlp string
	stagecmd.OTLPFlag(fs, &otlp)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *keysPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "gateway: --keys is required, and no arguments")
		return 2
	}
	log := stagecmd.Logger(*logLevel)
	keys, err := gateway.LoadKeys(*keysPath)
	if err != nil {
		log.Error("keys", "err", err)
		return 1
	}
	pol, err := policy.Load(*policyPath)
	if err != nil {
		log.Error("policy", "err", err)
		return 1
	}
	nc, js, err := account.Connect(*natsURL, *creds, "tollgate-gateway", log, nats.RetryOnFailedConnect(true))
	if err != nil {
		log.Error("connect", "err", err)
		return 1
	}
	defer nc.Drain()
	ctx, cancel := stagecmd.SignalContext()
	defer cancel()
	stopTracing, err := stagecmd.Tracing(ctx, otlp, "tollgate-gateway", log)
	if err != nil {
		log.Error("tracing", "err", err)
		return 1
	}
	defer stagecmd.FlushTraces(stopTracing, log)
	reg := stagecmd.NewRegistry()
	ready, err := health.New(reg, "gateway")
	if err != nil {
		log.Error("health", "err", err)
		return 1
	}
	ready.Add(health.NATS(nc))
	if err := stagecmd.ServeMetrics(ctx, *metricsAddr, reg, ready, log); err != nil {
		log.Error("metrics", "err", err)
		return 1
	}
	// One consumer of the events stream serves every live stream of the
	// process: the API's and the inbox's.
	events := eventfeed.New(js, log)
	defer events.Close()
	cfg := gateway.Config{JS: js, Policy: pol, Keys: keys, Addr: *addr, Logger: log, Registerer: reg, Events: events, MaxStreams: *maxStreams}
	if cfg.Web, err = inbox.handler(js, pol, *addr, log, events, *maxStreams); err != nil {
		log.Error("web inbox", "err", err)
		return 1
	}
	if *webhooksPath != "" {
		wc, err := webhook.LoadConfig(*webhooksPath)
		if err != nil {
			log.Error("webhooks", "err", err)
			return 1
		}
		wc.Logger, wc.Registerer = log, reg
		if cfg.Webhooks, err = webhook.New(js, wc); err != nil {
			log.Error("webhooks", "err", err)
			return 1
		}
	}
	s, err := gateway.New(cfg)
	if err != nil {
		log.Error("gateway", "err", err, "hint", "start Tollgate's stages first: they create the streams and buckets")
		return 1
	}
	if err := s.Run(ctx); err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	return 0
}

// newKey prints a fresh API key: the token (give it to the key's holder;
// it is not stored) and the entry to add to the keys file.
func newKey(args []string) int {
	fs := flag.NewFlagSet("gateway newkey", flag.ContinueOnError)
	transport := fs.String("transport", "gateway", "transport name the key acts as")
	scopes := fs.String("scopes", "submit,read,decide", "comma-separated scopes: submit, read, decide")
	vouch := fs.Bool("vouch", false, "senders and deciders of this key's requests are verified (the holder authenticates them)")
	if err := fs.Parse(args); err != nil {
		return 2
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
