// Command customtool runs Tollgate's four stages inside a program of its
// own, with a tool of its own: word_count, a Go type implementing
// tools.Tool, registered next to the built-in echo. It is how a team adds
// its tools without forking Tollgate: build the stages with tollgate.New,
// passing every dependency in, and run them.
//
// Usage:
//
//	go run ./examples/customtool                   # an embedded nats-server, data in ./.customtool
//	go run ./examples/customtool -nats nats://127.0.0.1:4222 -seal-keys keys.json
//
// then, in another terminal, with the URL it logs:
//
//	tollgate send --nats URL --session demo --sender alice --call 'word_count={"text":"one two three"}'
//	tollgate outcome --nats URL --wait 10s TURN
//
// Processes that run stages on one broker must share the seal keys (a
// context sealed by one is verified by the others); `tollgate send` needs
// none.
//
// Stages on one broker share their durable consumers: every executor there
// takes a share of the calls. So with -nats it refuses to start when an
// executor without word_count already runs on that broker (`tollgate dev`,
// `make run`): that executor would take some word_count calls and fail them
// TOOL_NOT_FOUND. Run it on its own embedded server (no -nats), as above,
// or beside copies of itself; -share starts it anyway.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/tools"
)

// policyJSON lets word_count and echo run without an approval; any other
// tool needs one.
const policyJSON = `{
  "version": "customtool-1",
  "default_approval": "required",
  "tools": {
    "echo":       {"approval": "never"},
    "word_count": {"approval": "never"}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}},
  "default_transport": {"trust_boundary": "external", "interactive": true}
}`

// WordCount is the example's own tool: it counts the words of its "text"
// argument, for the requester of the turn (the TurnContext the call runs
// under is its only authority).
type WordCount struct{}

// Name implements tools.Tool.
func (WordCount) Name() string { return "word_count" }

// RetrySafe implements tools.Retryable: counting has no side effect, so a
// call whose worker died may be run again.
func (WordCount) RetrySafe() bool { return true }

// Run implements tools.Tool.
func (WordCount) Run(_ context.Context, c tools.Call) (string, error) {
	var a struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(c.Args), &a); err != nil {
		return "", fmt.Errorf("word_count: args: %w", err)
	}
	return fmt.Sprintf("%d words, counted for %s", len(strings.Fields(a.Text)), c.Context.Requester.Principal), nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "customtool:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("customtool", flag.ContinueOnError)
	natsURL := fs.String("nats", "", "NATS URL; empty starts an embedded nats-server on a free loopback port")
	data := fs.String("data", "./.customtool", "data directory: the embedded server's store and the default key file")
	keyFile := fs.String("seal-keys", "", "TurnContext seal key file; empty uses <data>/seal-keys.json, created if missing")
	share := fs.Bool("share", false, "start even when an executor without word_count already runs on -nats (it would fail some word_count calls)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	url := *natsURL
	if url == "" {
		ns, err := embedded.Start(embedded.Options{StoreDir: filepath.Join(*data, "jetstream"), Port: -1})
		if err != nil {
			return err
		}
		defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
		url = ns.ClientURL()
	}
	keys, err := loadKeys(*keyFile, *data)
	if err != nil {
		return err
	}
	pol, err := policy.Parse([]byte(policyJSON))
	if err != nil {
		return err
	}
	nc, err := nats.Connect(url, nats.Name("customtool"), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Drain()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if other := otherExecutor(nc); other != "" && !*share {
		return fmt.Errorf("an executor without word_count already runs on %s (%s): the stages here would share its consumers, "+
			"and it would take some word_count calls and fail them TOOL_NOT_FOUND. Run customtool without -nats (its own embedded server), "+
			"stop the other executor, or give -share to start anyway", url, other)
	}

	host, _ := os.Hostname()
	p, err := tollgate.New(ctx, tollgate.Config{
		JS: js, Policy: pol, Keys: keys, Logger: log,
		Tools:    []tools.Tool{tools.Echo{}, WordCount{}},
		Instance: fmt.Sprintf("customtool-%s:%d", host, os.Getpid()),
	})
	if err != nil {
		return err
	}
	specs, _ := p.Tools.List(ctx) // only static tools here: List cannot fail
	var names []string
	for _, s := range specs {
		names = append(names, s.Name)
	}
	log.Info("customtool running", "nats", url, "tools", names)
	return p.Run(ctx)
}

// loadKeys reads the key file at path, or <data>/seal-keys.json (created
// with one new key if missing) when path is empty.
func loadKeys(path, data string) (*seal.KeyRing, error) {
	if path != "" {
		return seal.Load(path)
	}
	if err := os.MkdirAll(data, 0o750); err != nil {
		return nil, err
	}
	keys, _, err := seal.EnsureFile(filepath.Join(data, "seal-keys.json"))
	return keys, err
}

// otherExecutor asks the executors on nc's broker for their tools (the
// request `tollgate tools` makes) and describes the first that answers
// without word_count; "" when none answers or it has word_count (a copy of
// this program).
func otherExecutor(nc *nats.Conn) string {
	msg, err := nc.Request(topology.SubjectToolsList, nil, 2*time.Second)
	if err != nil {
		return ""
	}
	var l struct {
		PolicyVersion string `json:"policy_version"`
		Tools         []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if json.Unmarshal(msg.Data, &l) != nil {
		return ""
	}
	var names []string
	for _, t := range l.Tools {
		if t.Name == (WordCount{}).Name() {
			return ""
		}
		names = append(names, t.Name)
	}
	return fmt.Sprintf("policy %s, tools %s", l.PolicyVersion, strings.Join(names, " "))
}
