package approver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
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
// answered once it is (pipeline/submit: HeaderResult applied, vote or
// idempotent, or a micro error whose code is the rejection's reason code;
// the rejection is published as well). An applied decision is made
// durable once, by its compare-and-set on the approval record: no stream
// keeps the request. Bad input (a body that does not decode, or names
// another transport or approval than its subject, which carries the
// sender's identity) is dead-lettered on tollgate.dlq.approver with the
// request's bytes and answered with the reason code. What the service
// does not finish it hands back, answered submit.NotTaken, for the sender
// to store on TOLLGATE_DECISIONS, where the approver's consumer handles
// it: a decision whose handling failed transiently, one whose approval
// record is missing while Config.NotFoundGrace is set (the consumer
// rejects it once the grace has passed), a standing grant's revocation,
// one whose handling panicked, and bad input whose dead letter could not
// be stored. The service publishes nothing on the
// decision stream itself.
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
	// The server knows the service's subscription before the stage
	// reports itself consuming: a decision sent after that is answered.
	if err := a.cfg.JS.Conn().FlushTimeout(5 * time.Second); err != nil {
		a.cfg.Logger.Warn("decision service: flush its subscription", "err", err)
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
	defer func() {
		if p := recover(); p != nil {
			a.cfg.Logger.Error("decision request: handler panic; handed back to the stream", "subject", req.Subject(), "panic", p)
			a.respondError(req, submit.NotTaken, fmt.Sprintf("%s: the approver failed on it; store it on the decision stream", schemas.CodeHandlerPanic))
		}
	}()
	d, err := decodeOn(req.Data(), req.Subject(), topology.DecideSubject)
	switch {
	case err != nil:
		a.refuse(ctx, req, err)
		return
	case schemas.IsGrantID(d.ApprovalID):
		// Its refusals are published, not returned: the consumer's.
		a.respondError(req, submit.NotTaken, "a grant's revocation is taken on the decision stream")
		return
	}
	res, err := a.decide(ctx, d, a.missingIsFinal(nil))
	switch {
	case err != nil:
		a.cfg.Logger.Warn("decision request: transient failure; handed back to the stream", "decision", d.DecisionID, "approval", d.ApprovalID, "err", err)
		a.respondError(req, submit.NotTaken, "the approver could not apply it now: "+err.Error())
	case res.rejected != nil:
		a.respondError(req, string(res.rejected.Code), res.rejected.Reason)
	default:
		a.respond(req, submit.Result(res.label))
	}
}

// refuse dead-letters bad input with its bytes and answers its code; a
// dead letter that cannot be stored is handed back (NotTaken), so that
// the consumer dead-letters it from the stream.
func (a *Approver) refuse(ctx context.Context, req micro.Request, bad error) {
	code := schemas.CodeOf(bad)
	if err := runner.DeadLetterRequest(ctx, a.cfg.JS, a.cfg.Metrics, Stage, req.Subject(), req.Data(), nats.Header(req.Headers()), code, bad); err != nil {
		a.cfg.Logger.Warn("decision request: cannot dead-letter bad input; handed back to the stream", "subject", req.Subject(), "code", code, "err", err)
		a.respondError(req, submit.NotTaken, "the approver could not dead-letter it: "+err.Error())
		return
	}
	a.cfg.Logger.Warn("decision request: dead-lettered", "subject", req.Subject(), "code", code, "err", bad)
	a.decisions.WithLabelValues(string(code)).Inc()
	a.respondError(req, string(code), schemas.ReasonOf(bad))
}

// respond and respondError answer req on its reply subject with the
// connection itself, from the goroutine that handled it: micro's own
// Respond and Error record their result in the request for the
// endpoint's stats, which micro reads once its handler returns (at once
// here), so calling them later would race with it. The stats count the
// requests received; their results are in tollgate_decisions_total.
func (a *Approver) respond(req micro.Request, r submit.Result) {
	a.reply(req, nats.Header{submit.HeaderResult: []string{string(r)}})
}

func (a *Approver) respondError(req micro.Request, code, reason string) {
	a.reply(req, nats.Header{micro.ErrorCodeHeader: []string{code}, micro.ErrorHeader: []string{reason}})
}

func (a *Approver) reply(req micro.Request, h nats.Header) {
	if req.Reply() == "" {
		return // sent without a reply subject: nobody waits for the answer
	}
	if err := a.cfg.JS.Conn().PublishMsg(&nats.Msg{Subject: req.Reply(), Header: h}); err != nil {
		a.cfg.Logger.Warn("decision request: cannot answer", "subject", req.Subject(), "err", err)
	}
}
