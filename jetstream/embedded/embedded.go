// Package embedded runs an in-process nats-server with JetStream on loopback,
// for `tollgate dev`, tests and benchmarks.
package embedded

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configures an embedded server.
type Options struct {
	// StoreDir is JetStream's file store directory. Required.
	StoreDir string
	// Host defaults to 127.0.0.1. Only loopback addresses are accepted.
	Host string
	// Port is the client port; -1 picks a free one.
	Port int
	// SyncAlways makes JetStream fsync every write (sync_interval: always)
	// instead of every 2 minutes. See docs/operations.md.
	SyncAlways bool
	// ServerName names the server in logs and cluster metadata.
	ServerName string
	// Logger, if set, receives the server's log (debug and trace stay off).
	Logger server.Logger
}

// Validate reports options Start would reject.
func (o Options) Validate() error {
	if o.StoreDir == "" {
		return errors.New("embedded: StoreDir is required")
	}
	switch o.Host {
	case "", "127.0.0.1", "localhost", "::1":
	default:
		return fmt.Errorf("embedded: host %q is not loopback", o.Host)
	}
	return nil
}

// Start starts a server and waits until it accepts clients. The caller must
// Shutdown it (and may WaitForShutdown).
func Start(o Options) (*server.Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	host := o.Host
	if host == "" {
		host = "127.0.0.1"
	}
	name := o.ServerName
	if name == "" {
		name = "tollgate-embedded"
	}
	opts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       o.Port,
		JetStream:  true,
		StoreDir:   o.StoreDir,
		NoSigs:     true,
		NoLog:      o.Logger == nil,
		HTTPPort:   0,
		SyncAlways: o.SyncAlways,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: new server: %w", err)
	}
	if o.Logger != nil {
		ns.SetLoggerV2(o.Logger, false, false, false)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded: server not ready within 10s")
	}
	return ns, nil
}
