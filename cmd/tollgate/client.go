package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/legacy"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/seal"
)

// defaultTimeout is how long a client command waits for the server.
const defaultTimeout = 10 * time.Second

// client holds the flags every client command shares and its connection.
type client struct {
	url     string
	creds   string
	json    bool
	timeout time.Duration

	nc *nats.Conn
	js jetstream.JetStream
}

// register adds the shared flags to fs; timeout is the --timeout default.
func (c *client) register(fs *flag.FlagSet, timeout time.Duration) {
	fs.StringVar(&c.url, "nats", scaffold.Env("TOLLGATE_NATS_URL", scaffold.DefaultNATSURL), "NATS URL (env TOLLGATE_NATS_URL)")
	fs.StringVar(&c.creds, "creds", scaffold.Env("TOLLGATE_NATS_CREDS", ""), "NATS credentials file (env TOLLGATE_NATS_CREDS)")
	fs.BoolVar(&c.json, "json", false, "machine-readable JSON output")
	fs.DurationVar(&c.timeout, "timeout", timeout, "how long to wait for the server")
}

func (c *client) connect() error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nc, js, err := scaffold.Connect(c.url, c.creds, "tollgate-cli", quiet)
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

// store opens the buckets. Approval records are read as the stages read
// them: a version 1 record goes through the one compatibility path
// (pipeline/legacy), which restores its TurnContext or refuses it with a
// code, and logs it on stderr. The CLI never writes a record it read, so
// the seal legacy puts on a restored context is made with a key of this
// process alone.
func (c *client) store(ctx context.Context) (*store.Store, error) {
	b, err := topology.OpenBuckets(ctx, c.js)
	if err != nil {
		return nil, err
	}
	keys, err := seal.NewFile("cli").Ring()
	if err != nil {
		return nil, err
	}
	compat, err := legacy.New(keys, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), nil)
	if err != nil {
		return nil, err
	}
	st := store.New(b)
	st.Approvals.Decode = compat.DecodeApproval
	return st, nil
}

// fail reports err of command name on stderr, with a hint when one fits,
// and returns exit status 1.
// startNoArgs parses args for cmd, a command that takes flags only, and
// connects. When it reports false, the command returns exit (usage or
// connection failure, already printed); otherwise it defers c.close().
func (c *client) startNoArgs(cmd *command, fs *flag.FlagSet, args []string) (exit int, ok bool) {
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit, false
	}
	if len(pos) > 0 {
		return cmd.usageError("no arguments expected, got %q", pos), false
	}
	if err := c.connect(); err != nil {
		return c.fail(cmd.name, err), false
	}
	return 0, true
}

func (c *client) fail(name string, err error) int {
	fmt.Fprintf(os.Stderr, "tollgate %s: %v\n", name, err)
	h := hint(err, c.url)
	if errors.Is(err, jetstream.ErrBucketNotFound) && c.streamsExist() {
		h = bucketLostHint
	}
	if h != "" {
		fmt.Fprintf(os.Stderr, "hint: %s\n", h)
	}
	return 1
}

// bucketLostHint is the hint when a bucket is missing on a server that
// has Tollgate's streams: the bucket was deleted or lost, and the streams
// hold what it held.
const bucketLostHint = "Tollgate's streams are there but a bucket is missing (deleted or lost): " +
	"`tollgate replay` reports what the streams hold, `tollgate replay --rebuild` recreates the bucket and writes its records back (docs/operations.md, Replay)"

// streamsExist reports whether the server c is connected to holds
// Tollgate's turns stream (false when it cannot tell).
func (c *client) streamsExist() bool {
	if c.js == nil {
		return false
	}
	ctx, cancel := c.ctx()
	defer cancel()
	_, err := c.js.Stream(ctx, topology.StreamTurns)
	return err == nil
}

// hint says what a user can do about err, a failure talking to the server
// at url, or "" when there is nothing useful to add.
func hint(err error, url string) string {
	switch {
	case errors.Is(err, nats.ErrNoServers):
		return "is `tollgate dev` (make run) running? is --nats right?"
	case errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, jetstream.ErrNoStreamResponse):
		return fmt.Sprintf("connected to %s but Tollgate's topology is missing: start the stages once (tollgate dev or the stage binaries), or check --nats points at the Tollgate server", url)
	}
	return ""
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

// recordMap is asMap of a decoded record: its wire field names, as decoded
// (a legacy record as the compatibility path restored it).
func recordMap(rec any) any {
	b, err := msgpack.Marshal(rec)
	if err != nil {
		return map[string]any{"unencodable": err.Error()}
	}
	return asMap(b)
}

// fail reports a failure on stderr and returns exit status 1.
func fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "tollgate: "+format+"\n", args...)
	return 1
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n -= 3
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// warnLine is the line a human surface of this command prints under a
// call that holds a character reveal escapes.
const warnLine = "  ! " + reveal.Warning

func signalCtx() (context.Context, context.CancelFunc) { return scaffold.SignalContext() }
