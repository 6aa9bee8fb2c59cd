package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
)

// client holds the flags every client command shares and its connection.
type client struct {
	url     string
	creds   string
	json    bool
	timeout time.Duration

	nc *nats.Conn
	js jetstream.JetStream
}

func (c *client) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "nats", stagecmd.Env("TOLLGATE_NATS_URL", stagecmd.DefaultNATSURL), "NATS URL (env TOLLGATE_NATS_URL)")
	fs.StringVar(&c.creds, "creds", stagecmd.Env("TOLLGATE_NATS_CREDS", ""), "NATS credentials file (env TOLLGATE_NATS_CREDS)")
	fs.BoolVar(&c.json, "json", false, "machine-readable JSON output")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long to wait for the server")
}

func (c *client) connect() error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nc, js, err := stagecmd.Connect(c.url, c.creds, "tollgate-cli", quiet)
	if err != nil {
		return err
	}
	c.nc, c.js = nc, js
	return nil
}

func (c *client) close() {
	if c.nc != nil {
		c.nc.Close()
	}
}

func (c *client) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.timeout)
}

func (c *client) store(ctx context.Context) (*store.Store, error) {
	b, err := topology.OpenBuckets(ctx, c.js)
	if err != nil {
		return nil, fmt.Errorf("%w (is Tollgate running? start it with 'make run')", err)
	}
	return store.New(b), nil
}

// printJSON writes v as indented JSON on stdout.
func printJSON(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// asMap turns a msgpack record into a generic map whose keys are the wire
// field names, for --json output that matches docs/protocol.md.
func asMap(b []byte) any {
	var v any
	if err := msgpack.Unmarshal(b, &v); err != nil {
		return map[string]any{"undecodable": fmt.Sprintf("%d bytes: %v", len(b), err)}
	}
	return v
}

func fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "tollgate: "+format+"\n", args...)
	return 1
}

// parseFlags parses args with fs allowing flags after positional arguments
// (tollgate approve ID --as alice). It returns the positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, bool) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, false
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, true
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func signalCtx() (context.Context, context.CancelFunc) { return stagecmd.SignalContext() }
