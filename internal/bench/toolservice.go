package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// benchTool is the tool service path's approved call: write_file's work
// (tools.WriteFile, into a sandbox of the service's own) behind a NATS tool
// service, so that the only difference from the approval path's built-in
// write_file is the hop.
const benchTool = "bench.write_file"

// pingSubject is a plain endpoint of the bench tool service (not a tool)
// that answers at once: a bare request round trip on the same server.
const pingSubject = "bench.ping"

// toolService is the bench's NATS tool service: a micro service on a
// connection of its own, in this process.
type toolService struct {
	nc    *nats.Conn
	svc   micro.Service
	calls atomic.Int64 // benchTool calls answered ok
}

// startToolService starts the bench tool service on e. Tollgate finds it
// by discovery (natstool), as any tool service.
func startToolService(e *env) (*toolService, error) {
	dir := e.sandbox("sandbox-tool-service")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(e.url, nats.Name("bench-tool-service"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", e.url, err)
	}
	ts := &toolService{nc: nc}
	svc, err := micro.AddService(nc, micro.Config{Name: "bench", Version: "1.0.0", Description: "The bench's tool service"})
	if err != nil {
		nc.Close()
		return nil, err
	}
	ts.svc = svc
	wf := &tools.WriteFile{Dir: dir}
	spec := wf.Spec()
	err = svc.AddGroup(natstool.SubjectPrefix+"bench").AddEndpoint("write_file", micro.HandlerFunc(func(req micro.Request) {
		ts.write(wf, req)
	}), micro.WithEndpointMetadata(map[string]string{
		natstool.MetaDescription: spec.Description,
		natstool.MetaSchema:      string(spec.InputSchema),
	}))
	if err == nil {
		err = svc.AddEndpoint("ping", micro.HandlerFunc(func(req micro.Request) { _ = req.Respond(nil) }), micro.WithEndpointSubject(pingSubject))
	}
	if err != nil {
		ts.stop()
		return nil, err
	}
	return ts, nil
}

// write runs one benchTool call.
func (ts *toolService) write(wf *tools.WriteFile, req micro.Request) {
	id := micro.WithHeaders(micro.Headers{natstool.HeaderCallID: {req.Headers().Get(natstool.HeaderCallID)}})
	var r natstool.Request
	if err := json.Unmarshal(req.Data(), &r); err != nil {
		_ = req.Error("400", err.Error(), nil, id)
		return
	}
	out, err := wf.Run(context.Background(), tools.Call{CallID: r.CallID, Args: string(r.Args)})
	if err != nil {
		_ = req.Error("500", err.Error(), nil, id)
		return
	}
	ts.calls.Add(1)
	_ = req.Respond([]byte(out), id)
}

func (ts *toolService) stop() {
	_ = ts.svc.Stop()
	ts.nc.Close()
}

// pinger measures bare request round trips to the tool service's ping
// endpoint, one every interval, on a connection of its own, until stop.
func pinger(url string, interval time.Duration) (stop func() ([]time.Duration, error), err error) {
	nc, err := nats.Connect(url, nats.Name("bench-pinger"))
	if err != nil {
		return nil, err
	}
	quit, done := make(chan struct{}), make(chan struct{})
	var rts []time.Duration
	var perr error
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			t0 := time.Now()
			if _, err := nc.Request(pingSubject, nil, 5*time.Second); err != nil {
				perr = fmt.Errorf("ping %s: %w", pingSubject, err)
				return
			}
			rts = append(rts, time.Since(t0))
		}
	}()
	return func() ([]time.Duration, error) {
		close(quit)
		<-done
		nc.Close()
		return rts, perr
	}, nil
}

// checkOutcomes reads every turn outcome stored on e's server (where the
// write that ended the turn keeps it, or its published copy:
// outcomes.Stored) and fails
// unless each is a completed turn whose calls all returned ok: a figure
// counts outcomes, and must not count turns that failed (an approved call
// that did not run, a tool service that was not found).
func (e *env) checkOutcomes() error {
	nc, js, err := e.connect("bench-check")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stored, err := outcomes.Stored(ctx, js)
	if err != nil {
		return err
	}
	n, bad, example := 0, 0, ""
	for _, outs := range stored {
		for _, o := range outs {
			n++
			if reason := notOK(o); reason != "" {
				bad++
				example = reason
			}
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d turn outcomes are not completed with every call ok, e.g. %s", bad, n, example)
	}
	return nil
}

// notOK says why o is not a completed turn whose calls all returned ok
// ("" if it is).
func notOK(o *schemas.TurnOutcome) string {
	if o.State != schemas.TurnCompleted {
		return fmt.Sprintf("turn %s %s (%s)", o.TurnID, o.State, o.Code)
	}
	for _, r := range o.Results {
		if r.Status != schemas.ResultOK {
			return fmt.Sprintf("call %s (%s) %s (%s: %s)", r.CallID, r.Tool, r.Status, r.Code, r.Reason)
		}
	}
	return ""
}
