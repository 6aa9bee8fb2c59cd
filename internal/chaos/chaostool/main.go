// Command chaostool runs the chaos harness's remote tool service
// (internal/chaos/toolsvc) until SIGINT or SIGTERM. The harness starts
// several, SIGKILLs and restarts them like the stage workers.
//
// Environment (set by the harness): TOLLGATE_NATS_URL (comma-separated
// URLs), TOLLGATE_LEDGER (the ledger file).
package main

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("chaostool", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	ledger := os.Getenv("TOLLGATE_LEDGER")
	if ledger == "" {
		return errors.New("TOLLGATE_LEDGER is not set")
	}
	nc, err := nats.Connect(os.Getenv("TOLLGATE_NATS_URL"), nats.Name("chaostool"), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return err
	}
	defer nc.Close()
	svc, err := toolsvc.Serve(nc, ledger, log)
	if err != nil {
		return err
	}
	log.Info("tool service serving", "id", svc.Info().ID)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	if err := svc.Stop(); err != nil {
		return err
	}
	return nc.Drain()
}
