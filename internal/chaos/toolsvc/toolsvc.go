// Package toolsvc is the chaos harness's remote tool service (run as the
// chaostool binary, internal/chaos/chaostool) and what the harness and the
// service share: the tool names, the ledger line, the exit status of a
// planned crash.
//
// The service is a NATS tool service (nats.go micro, the default queue
// group, so that its replicas are one tool to natstool) offering Ledger and
// LedgerGuarded. Both record every request they receive in the harness's
// ledger, as the in-process ledger tools do (tools.Ledger), so that the
// harness counts their executions like those. The service never
// deduplicates on the call id: a call sent twice is journaled twice, and
// the harness's checks find it.
//
// A call whose arguments carry "crash": true is journaled (Execution.Crash)
// and then the process exits with status CrashExit without replying: the
// reply is lost after the tool acted, which Tollgate must report as
// needs_attention EXECUTION_UNCERTAIN, and never send again.
package toolsvc

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// Service is the service's name, and so the prefix of its tool names.
const Service = "chaos"

// The service's tools: like tools.LedgerTool (the policy runs it at once)
// and tools.LedgerGuardedTool (it needs an approval).
const (
	Ledger        = Service + "." + tools.LedgerTool
	LedgerGuarded = Service + "." + tools.LedgerGuardedTool
)

// CrashExit is the exit status of a planned crash.
const CrashExit = 75

// Schema is the arguments schema of both tools: the harness's call
// coordinates and the crash flag.
const Schema = `{"type":"object","properties":{"turn":{"type":"integer"},"call":{"type":"integer"},"crash":{"type":"boolean"}},"required":["turn","call"],"additionalProperties":false}`

// Execution is one ledger line: a tools.LedgerEntry as tools.Ledger writes
// it, or, written by this service, with the context fields it can know
// taken from the request's view (no stream sequence, no digest), View set
// and Crash when it did not reply.
type Execution struct {
	tools.LedgerEntry
	// View is the TurnContext view the service received; nil for the
	// in-process ledger tools.
	View *natstool.ContextView `json:"ctx_view,omitempty"`
	// Crash: the service exited after journaling, without replying.
	Crash bool `json:"crash,omitempty"`
}

// Remote reports whether e was written by the tool service.
func (e Execution) Remote() bool { return e.View != nil }

// Serve adds the service on nc; its handlers append to the ledger file at
// ledger. Stop the returned service to end it.
func Serve(nc *nats.Conn, ledger string, log *slog.Logger) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{Name: Service, Version: "1.0.0", Description: "The chaos harness's remote ledger tools"})
	if err != nil {
		return nil, err
	}
	g := svc.AddGroup(natstool.SubjectPrefix + Service)
	for _, name := range []string{tools.LedgerTool, tools.LedgerGuardedTool} {
		tool := Service + "." + name
		err := g.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) { handle(log, ledger, tool, req) }),
			micro.WithEndpointMetadata(map[string]string{
				natstool.MetaDescription: "Records the call in the chaos ledger.",
				natstool.MetaSchema:      Schema,
			}))
		if err != nil {
			_ = svc.Stop()
			return nil, err
		}
	}
	return svc, nil
}

// handle journals one request, then replies, or exits without replying for
// a crash call.
func handle(log *slog.Logger, ledger, tool string, req micro.Request) {
	id := micro.WithHeaders(micro.Headers{natstool.HeaderCallID: {req.Headers().Get(natstool.HeaderCallID)}})
	var r natstool.Request
	if err := json.Unmarshal(req.Data(), &r); err != nil {
		_ = req.Error("400", "request: "+err.Error(), nil, id)
		return
	}
	var a struct {
		Crash bool `json:"crash"`
	}
	if err := json.Unmarshal(r.Args, &a); err != nil {
		_ = req.Error("400", "args: "+err.Error(), nil, id)
		return
	}
	v := r.Context
	e := Execution{
		LedgerEntry: tools.LedgerEntry{
			CallID: r.CallID, Tool: tool, Args: string(r.Args),
			CtxTurnID: v.TurnID, CtxSessionID: v.SessionID, CtxPrincipal: v.Requester.Principal,
			PID: os.Getpid(), At: time.Now().UnixNano(),
		},
		View: &v, Crash: a.Crash,
	}
	if err := appendLine(ledger, e); err != nil {
		log.Error("ledger write failed", "call", r.CallID, "err", err)
		_ = req.Error("500", err.Error(), nil, id)
		return
	}
	if a.Crash {
		log.Warn("exiting after the call, before the reply, as planned", "call", r.CallID)
		os.Exit(CrashExit)
	}
	_ = req.Respond(fmt.Appendf(nil, "recorded %s in pid %d", r.CallID, e.PID), id)
}

// appendLine appends e as one JSON line in a single write on a file opened
// with O_APPEND, as tools.Ledger does: lines of concurrent processes never
// interleave, and a process killed at any point leaves the whole line or
// none.
func appendLine(path string, e Execution) error {
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	n, err := f.Write(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != len(line) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(line))
	}
	return err
}
