// Command toolservice-go is a Tollgate tool service written with nats.go's
// micro package: a NATS service whose endpoints carry tollgate metadata, so
// that Tollgate discovers them as tools (see docs/tools.md). It offers two
// tools of a pretend deployment system:
//
//   - deploys.deploy {"service","version"}: deploys a service at a
//     version. Not safe to re-run blindly (the metadata says nothing of
//     retry_safe), but idempotent on the call id: a request with a call id
//     it has already handled returns the first answer and deploys nothing.
//   - deploys.status {"service"}: the version a service runs. Read-only,
//     so "tollgate.retry_safe" is "true".
//
// Each reply carries the request's Tollgate-Call-Id header back; a bad
// request gets a service error (Nats-Service-Error headers), which Tollgate
// reports as the tool's error.
//
// Environment:
//
//	NATS_URL              the server (default nats://127.0.0.1:4222)
//	NATS_USER, NATS_PASSWORD  credentials (e.g. the toolsvc user of
//	                      deploy/nats/least-privilege.conf)
//	TOOLSERVICE_JOURNAL   a file to which every request received is
//	                      appended as "<tool> <call id>" (for demos and tests)
//	TOOLSERVICE_DELAY_MS  a delay before each deploy answers (to see a
//	                      timeout become EXECUTION_UNCERTAIN)
//
// It stops on SIGINT or SIGTERM.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/tools/natstool"
)

const deploySchema = `{
  "type": "object",
  "properties": {
    "service": {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,62}$"},
    "version": {"type": "string", "minLength": 1, "maxLength": 64}
  },
  "required": ["service", "version"],
  "additionalProperties": false
}`

const statusSchema = `{
  "type": "object",
  "properties": {"service": {"type": "string"}},
  "required": ["service"],
  "additionalProperties": false
}`

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("toolservice-go", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	delay := time.Duration(0)
	if v := os.Getenv("TOOLSERVICE_DELAY_MS"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("TOOLSERVICE_DELAY_MS: %w", err)
		}
		delay = time.Duration(ms) * time.Millisecond
	}
	opts := []nats.Option{nats.Name("toolservice-go"), nats.MaxReconnects(-1)}
	if u := os.Getenv("NATS_USER"); u != "" {
		opts = append(opts, nats.UserInfo(u, os.Getenv("NATS_PASSWORD")))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()

	d := &deployer{journal: os.Getenv("TOOLSERVICE_JOURNAL"), delay: delay, running: map[string]string{}, done: map[string]string{}}
	svc, err := micro.AddService(nc, micro.Config{
		Name: "deploys", Version: "1.0.0", Description: "A pretend deployment system, as Tollgate tools",
	})
	if err != nil {
		return err
	}
	// Endpoints live under tollgate.tool.<service>: the only subjects a
	// tool service's user may answer on (deploy/nats/least-privilege.conf).
	g := svc.AddGroup(natstool.SubjectPrefix + "deploys")
	if err := g.AddEndpoint("deploy", micro.HandlerFunc(d.deploy), micro.WithEndpointMetadata(map[string]string{
		natstool.MetaDescription: "Deploy a service at a version.",
		natstool.MetaSchema:      deploySchema,
	})); err != nil {
		return err
	}
	if err := g.AddEndpoint("status", micro.HandlerFunc(d.status), micro.WithEndpointMetadata(map[string]string{
		natstool.MetaDescription: "The version a service runs.",
		natstool.MetaSchema:      statusSchema,
		natstool.MetaRetrySafe:   "true",
	})); err != nil {
		return err
	}
	log.Info("serving", "service", "deploys", "id", svc.Info().ID, "url", nc.ConnectedUrlRedacted())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	if err := svc.Stop(); err != nil {
		return err
	}
	return nc.Drain()
}

// deployer is the pretend deployment system.
type deployer struct {
	journal string
	delay   time.Duration

	mu      sync.Mutex
	running map[string]string // service -> version
	done    map[string]string // call id -> the answer given
}

// decode reads a request and journals it.
func (d *deployer) decode(tool string, req micro.Request, args any) (*natstool.Request, error) {
	var r natstool.Request
	if err := json.Unmarshal(req.Data(), &r); err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if err := d.record(tool, r.CallID); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(r.Args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(args); err != nil {
		return nil, fmt.Errorf("args: %w", err)
	}
	return &r, nil
}

func (d *deployer) deploy(req micro.Request) {
	var a struct{ Service, Version string }
	r, err := d.decode("deploys.deploy", req, &a)
	if err == nil && (a.Service == "" || a.Version == "") {
		err = errors.New("args: service and version are required")
	}
	if err != nil {
		fail(req, "400", err)
		return
	}
	time.Sleep(d.delay)
	d.mu.Lock()
	defer d.mu.Unlock()
	// The call id is the idempotency key: a call answered before is
	// answered the same, and deploys nothing again.
	out, seen := d.done[r.CallID]
	if !seen {
		d.running[a.Service] = a.Version
		out = fmt.Sprintf("deployed %s %s for %s", a.Service, a.Version, r.Context.Requester.Principal)
		d.done[r.CallID] = out
	}
	respond(req, out)
}

func (d *deployer) status(req micro.Request) {
	var a struct{ Service string }
	if _, err := d.decode("deploys.status", req, &a); err != nil {
		fail(req, "400", err)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	v, ok := d.running[a.Service]
	if !ok {
		fail(req, "404", fmt.Errorf("%s is not deployed", a.Service))
		return
	}
	respond(req, fmt.Sprintf("%s runs %s", a.Service, v))
}

// record appends "<tool> <call id>" to the journal, if there is one.
func (d *deployer) record(tool, callID string) error {
	if d.journal == "" {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	f, err := os.OpenFile(d.journal, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %s\n", tool, callID)
	return errors.Join(err, f.Close())
}

// callID is the header every reply must carry back.
func callID(req micro.Request) micro.Headers {
	return micro.Headers{natstool.HeaderCallID: []string{req.Headers().Get(natstool.HeaderCallID)}}
}

func respond(req micro.Request, out string) {
	_ = req.Respond([]byte(out), micro.WithHeaders(callID(req)))
}

func fail(req micro.Request, code string, err error) {
	_ = req.Error(code, err.Error(), nil, micro.WithHeaders(callID(req)))
}
