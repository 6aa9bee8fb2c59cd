package approver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// DecideService is the name of the NATS service (nats.go micro) under
// which each approver answers decisions sent as requests on
// tollgate.decide.<transport>.<approval id> (topology.DecideSubject), in
// the service's queue group: one approver answers each request.
//
// A request is handled as a decision consumed from TOLLGATE_DECISIONS is
// (Handle), with the same checks and the same compare-and-set, and
// answered once it is (pipeline/submit: the answer's HeaderResult, or a
// micro error whose code is the rejection's reason code). An applied
// decision is made durable once, by its compare-and-set on the approval
// record; no stream keeps the request. What the service does not finish
// itself it stores on TOLLGATE_DECISIONS, on the stream subject of the
// request's transport and approval tokens, for the approver's consumer,
// and answers "queued" (or, for bad input, the error's code): a decision
// whose handling failed transiently (message id its decision id, so a
// sender that also stores it there stores it once), a grant revocation,
// a request that does not decode or whose body names another transport
// or approval than its subject (the consumer dead-letters it with the
// original bytes and the reason code, as it would have), and one whose
// handling panicked. When even that store fails it answers
// submit.NotTaken, and the sender stores the decision itself.
const DecideService = "tollgate-decide"

// decideTimeout bounds the handling of one decision request; the sender
// waits submit.DefaultTimeout.
const decideTimeout = 4 * time.Second

// serveDecisions starts the decision service on the approver's
// connection. Requests are handled by at most Concurrency goroutines at
// once (a request waits in the service's subscription while all are
// busy). The returned stop ends the service and waits for the requests
// in hand.
func (a *Approver) serveDecisions() (stop func(), err error) {
	slots := make(chan struct{}, a.cfg.Concurrency)
	var wg sync.WaitGroup
	svc, err := micro.AddService(a.cfg.JS.Conn(), micro.Config{
		Name:        DecideService,
		Version:     "1.0.0",
		Description: "Tollgate's approver: applies a decision on an approval and answers what it did",
		Endpoint: &micro.EndpointConfig{
			Subject: topology.SubjectDecide + "*.*",
			Handler: micro.HandlerFunc(func(req micro.Request) {
				slots <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-slots; wg.Done() }()
					a.answer(req)
				}()
			}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("approver: serve %s: %w", topology.SubjectDecide+"*.*", err)
	}
	return func() {
		if err := svc.Stop(); err != nil {
			a.cfg.Logger.Warn("decision service: stop", "err", err)
		}
		wg.Wait()
	}, nil
}

// answer handles one decision request and answers it.
func (a *Approver) answer(req micro.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), decideTimeout)
	defer cancel()
	transport, approval, _ := strings.Cut(strings.TrimPrefix(req.Subject(), topology.SubjectDecide), ".")
	defer func() {
		if p := recover(); p != nil {
			a.cfg.Logger.Error("decision request: handler panic", "subject", req.Subject(), "panic", p)
			a.queue(ctx, req, transport, approval, "", schemas.Errorf(schemas.CodeHandlerPanic, "handler panic: %v", p))
		}
	}()
	d, err := schemas.Decode[schemas.Decision](req.Data())
	if err == nil && (d.Transport != transport || d.ApprovalID != approval) {
		err = schemas.Errorf(schemas.CodeInvalidInput, "decision for %s from transport %s arrived on %s, want %s", d.ApprovalID, d.Transport, req.Subject(), topology.DecideSubject(d.Transport, d.ApprovalID))
	}
	switch {
	case err != nil:
		// Bad input: the consumer dead-letters it, with its bytes.
		a.queue(ctx, req, transport, approval, "", err)
		return
	case schemas.IsGrantID(d.ApprovalID):
		a.queue(ctx, req, transport, approval, topology.DecisionMsgID(d.DecisionID), nil)
		return
	}
	res, err := a.decide(ctx, d)
	switch {
	case err != nil:
		a.cfg.Logger.Warn("decision request: queued after a transient failure", "decision", d.DecisionID, "approval", d.ApprovalID, "err", err)
		a.queue(ctx, req, transport, approval, topology.DecisionMsgID(d.DecisionID), nil)
	case res.rejected != nil:
		a.respondError(req, string(res.rejected.Code), res.rejected.Reason)
	default:
		a.respond(req, submit.Result(res.label))
	}
}

// queue stores the request's bytes on TOLLGATE_DECISIONS for the
// approver's consumer and answers: bad's code when bad is set (the
// consumer will dead-letter it), else "queued"; NotTaken when the store
// fails.
func (a *Approver) queue(ctx context.Context, req micro.Request, transport, approval, msgID string, bad error) {
	if err := bus.PublishRaw(ctx, a.cfg.JS, topology.DecisionSubject(transport, approval), msgID, req.Data(), nil); err != nil {
		a.cfg.Logger.Warn("decision request: cannot queue it on the stream", "subject", req.Subject(), "err", err)
		a.respondError(req, submit.NotTaken, "the approver could not take the decision: "+err.Error())
		return
	}
	if bad != nil {
		a.respondError(req, string(schemas.CodeOf(bad)), schemas.ReasonOf(bad))
		return
	}
	a.respond(req, submit.Queued)
}

func (a *Approver) respond(req micro.Request, r submit.Result) {
	if err := req.Respond(nil, micro.WithHeaders(micro.Headers(nats.Header{submit.HeaderResult: []string{string(r)}}))); err != nil {
		a.cfg.Logger.Warn("decision request: cannot answer", "subject", req.Subject(), "err", err)
	}
}

func (a *Approver) respondError(req micro.Request, code, reason string) {
	if err := req.Error(code, reason, nil); err != nil {
		a.cfg.Logger.Warn("decision request: cannot answer", "subject", req.Subject(), "err", err)
	}
}
