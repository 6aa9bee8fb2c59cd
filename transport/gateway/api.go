package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tracing"
)

//go:embed openapi.json
var openAPI []byte

// route is one route of the API: its ServeMux pattern, the scope a key
// needs (none: open to all) and its handler.
type route struct {
	pattern string
	scope   Scope
	h       handler
}

// handler serves a request of key (nil on open routes); an error it
// returns is written as problem+json.
type handler func(w http.ResponseWriter, r *http.Request, key *Key) error

// routeHooks are added to by other files of the package (from init) to
// register further routes, such as /mcp, on a new Server's mux.
var routeHooks []func(s *Server, mux *http.ServeMux)

// apiRoutes is every route of the HTTP API; openapi.json documents each.
func (s *Server) apiRoutes() []route {
	return []route{
		{"GET /healthz", "", s.health},
		{"GET /v1/openapi.json", "", s.openapi},
		{"POST /v1/turns", ScopeSubmit, s.postTurn},
		{"GET /v1/turns/{id}", ScopeRead, s.getTurn},
		{"GET /v1/turns/{id}/events", ScopeRead, s.turnEvents},
		{"GET /v1/events", ScopeRead, s.sessionEvents},
		{"GET /v1/approvals", ScopeRead, s.listApprovals},
		{"GET /v1/approvals/{id}", ScopeRead, s.getApproval},
		{"POST /v1/approvals/{id}/decisions", ScopeDecide, s.postDecision},
	}
}

// routes registers every route on s.mux.
func (s *Server) routes() {
	for _, rt := range s.apiRoutes() {
		s.mux.HandleFunc(rt.pattern, s.counted(rt.pattern, s.with(rt.scope, rt.h)))
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, CodeNotFound, "no route "+r.Method+" "+r.URL.Path)
	})
	for _, add := range routeHooks {
		add(s, s.mux)
	}
}

// with authenticates the request for scope (none: open route), applies
// the key's rate limit and the body size limit, runs h and writes its
// error as problem+json.
func (s *Server) with(scope Scope, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var key *Key
		if scope != "" {
			k, err := s.authenticate(r, scope)
			if err != nil {
				s.fail(w, r, err)
				return
			}
			if !s.limiter(k).Allow() {
				w.Header().Set("Retry-After", "1")
				writeProblem(w, http.StatusTooManyRequests, CodeRateLimited, "API key "+k.ID+" is over its request rate")
				return
			}
			key = k
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if err := h(w, r, key); err != nil {
			s.fail(w, r, err)
		}
	}
}

// counted counts h's responses by route pattern and status in
// tollgate_gateway_requests_total.
func (s *Server) counted(pattern string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		s.requests.WithLabelValues(pattern, strconv.Itoa(sw.status)).Inc()
		tracing.SetHTTPStatus(r.Context(), sw.status)
	}
}

// statusWriter keeps the status of a response; it flushes (for SSE) and
// unwraps (for http.ResponseController) like the writer it wraps.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Authenticate checks the request's API key for scope, as every /v1 route
// does; on failure it has written the problem response and returns nil.
// For routes registered through routeHooks.
func (s *Server) Authenticate(w http.ResponseWriter, r *http.Request, scope Scope) *Key {
	k, err := s.authenticate(r, scope)
	if err == nil && !s.limiter(k).Allow() {
		w.Header().Set("Retry-After", "1")
		err = errorf(http.StatusTooManyRequests, CodeRateLimited, "API key %s is over its request rate", k.ID)
	}
	if err != nil {
		s.fail(w, r, err)
		return nil
	}
	return k
}

// limiter is key's rate limiter.
func (s *Server) limiter(k *Key) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limiters[k.ID]
	if l == nil {
		l = rate.NewLimiter(s.cfg.Rate, s.cfg.Burst)
		s.limiters[k.ID] = l
	}
	return l
}

// fail writes err as problem+json.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		writeProblem(w, ae.Status, ae.Code, ae.Detail)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		writeProblem(w, http.StatusServiceUnavailable, CodeUnavailable, "timed out")
	default:
		s.cfg.Logger.Error("gateway request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeProblem(w, http.StatusInternalServerError, CodeUnavailable, "internal error")
	}
}

// decodeBody decodes the request's JSON body into v: one object, no
// unknown fields, nothing after it, within the size limit.
func decodeBody(r *http.Request, v any) error { return decodeJSON(r.Body, v, false) }

// decodeJSON is the one decoder of the gateway's request bodies (the API,
// hooks): body into v, one JSON object and nothing after it, field names
// matched exactly (exactKeys); a field v does not have is refused unless
// allowUnknown (a hook's input, whose fields Claude Code may add to).
// Errors are *apiError: PAYLOAD_TOO_LARGE, MALFORMED_PAYLOAD or
// INVALID_INPUT naming the field.
func decodeJSON(body io.Reader, v any, allowUnknown bool) error {
	// The body (bounded by the route's MaxBytesReader) is read whole into
	// a pooled buffer and decoded from there: less copying and garbage
	// than a decoder refilling from the connection.
	buf := jsonBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledJSON {
			buf.Reset()
			jsonBufs.Put(buf)
		}
	}()
	_, err := buf.ReadFrom(body)
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
		if !allowUnknown {
			dec.DisallowUnknownFields()
		}
		if err = dec.Decode(v); err == nil {
			if _, err2 := dec.Token(); err2 != io.EOF {
				return errorf(http.StatusBadRequest, schemas.CodeMalformed, "data after the JSON object")
			}
			return exactKeys(buf.Bytes(), v, allowUnknown)
		}
	}
	var tooBig *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooBig):
		return errorf(http.StatusRequestEntityTooLarge, schemas.CodePayloadTooLarge, "request body over %d bytes", tooBig.Limit)
	case errors.Is(err, io.EOF):
		return errorf(http.StatusBadRequest, schemas.CodeMalformed, "empty body: want a JSON object")
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syn) || errors.As(err, &typ) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errorf(http.StatusBadRequest, schemas.CodeMalformed, "malformed JSON: %v", err)
	}
	return errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "%v", err)
}

// idempotencyKey reads the Idempotency-Key header: "" or a printable id
// of at most schemas.MaxIDBytes bytes.
func idempotencyKey(r *http.Request) (string, error) {
	k := r.Header.Get("Idempotency-Key")
	if len(k) > schemas.MaxIDBytes || !utf8.ValidString(k) || strings.ContainsFunc(k, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return "", errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "Idempotency-Key: at most %d bytes of printable UTF-8", schemas.MaxIDBytes)
	}
	return k, nil
}

func (s *Server) health(w http.ResponseWriter, r *http.Request, _ *Key) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func (s *Server) openapi(w http.ResponseWriter, r *http.Request, _ *Key) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
	return nil
}

// SubmitResponse is the body of POST /v1/turns: the turn and, as far as
// known after Config.SubmitWait, its state and each call's disposition.
type SubmitResponse struct {
	SubmitResult
	// State is the batch state, or "submitted" while no batch exists yet.
	State string     `json:"state"`
	Calls []CallView `json:"calls"`
}

// settled reports whether every call of v has its first disposition:
// the executor has evaluated the batch.
func settled(v *TurnView) bool {
	return v.State != schemas.BatchQueued && v.State != schemas.BatchRunning
}

func (s *Server) postTurn(w http.ResponseWriter, r *http.Request, key *Key) error {
	var req SubmitRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	id, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	req.MessageID = newMessageID()
	if id != "" {
		req.MessageID = idempotentMessageID(key, id)
	}
	// Follow the turn before submit looks for it, so that no write after
	// that look is missed: a new turn's first writes then come from the
	// feed, with no read that could only find nothing.
	var tw *turnWatch
	if turnID := schemas.TurnID(key.Transport, req.MessageID); schemas.ValidKey(turnID) {
		if tw, err = s.follow(turnID); err != nil {
			return err
		}
		defer tw.stop()
	}
	res, err := s.submit(r.Context(), key, req)
	if err != nil {
		return err
	}
	httpserve.Hold(w, r, s.cfg.SubmitWait)
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.SubmitWait)
	defer cancel()
	out := SubmitResponse{SubmitResult: res, State: "submitted", Calls: []CallView{}}
	var v *TurnView
	if tw != nil {
		v, _ = tw.until(ctx, settled, res.Duplicate)
	} else {
		v, _ = s.watchTurn(ctx, res.TurnID, settled)
	}
	if v != nil {
		out.State, out.Calls = string(v.State), callsFor(v.Calls, key)
	}
	w.Header().Set("Location", "/v1/turns/"+res.TurnID)
	writeJSON(w, http.StatusAccepted, out)
	return nil
}

// waitParam reads ?wait= (a Go duration such as 30s, or seconds), capped
// at Config.MaxWait.
func (s *Server) waitParam(r *http.Request) (time.Duration, error) {
	q := r.URL.Query().Get("wait")
	if q == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(q)
	if err != nil {
		n, err2 := strconv.Atoi(q)
		d, err = time.Duration(n)*time.Second, err2
	}
	if err != nil || d < 0 {
		return 0, errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "wait: want a duration such as 30s")
	}
	return min(d, s.cfg.MaxWait), nil
}

// ownTurn reads turnID's view for key: errUnknown (as 404) if it does not
// exist or belongs to another transport.
func ownTurn(v *TurnView, err error, key *Key) (*TurnView, error) {
	if errors.Is(err, errUnknown) || (err == nil && v.Transport != key.Transport) {
		return nil, notFound(CodeTurnNotFound, "such turn")
	}
	return v, err
}

func (s *Server) getTurn(w http.ResponseWriter, r *http.Request, key *Key) error {
	wait, err := s.waitParam(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	var v *TurnView
	if wait > 0 {
		httpserve.Hold(w, r, wait)
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		// Another transport's turn is answered at once (as unknown).
		v, err = s.watchTurn(ctx, id, func(v *TurnView) bool { return v.Terminal || v.Transport != key.Transport })
		if v == nil && err != nil && ctx.Err() != nil {
			err = errUnknown
		}
		if v != nil && ctx.Err() != nil && r.Context().Err() == nil {
			err = nil // the wait ran out: answer the current state
		}
	} else {
		v, err = s.turn(r.Context(), id)
	}
	if v, err = ownTurn(v, err, key); err != nil {
		return err
	}
	shown := *v
	shown.Calls = callsFor(v.Calls, key)
	writeJSON(w, http.StatusOK, &shown)
	return nil
}

// ownApproval reads approval id for key: 404 APPROVAL_NOT_FOUND if it
// does not exist, does not decode, or belongs to another transport.
func (s *Server) ownApproval(ctx context.Context, id string, key *Key) (*schemas.ApprovalRecord, error) {
	if !schemas.ValidKey(id) {
		return nil, notFound(schemas.CodeApprovalNotFound, "such approval")
	}
	a, _, err := s.store.Approvals.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound) || schemas.CodeOf(err) != "":
		return nil, notFound(schemas.CodeApprovalNotFound, "such approval")
	case err != nil:
		return nil, unavailable(err)
	case a.Context == nil || a.Context.Transport != key.Transport:
		return nil, notFound(schemas.CodeApprovalNotFound, "such approval")
	}
	return a, nil
}

// decisionApproval is ownApproval for a decision, which checks only what
// never changes in an approval record (its transport, turn, digest and
// options; its status is the approver's to judge): a record this gateway
// read a moment ago, for the view of its turn, serves as well as a read.
func (s *Server) decisionApproval(ctx context.Context, id string, key *Key) (*schemas.ApprovalRecord, error) {
	s.mu.Lock()
	a, ok := s.approvals.get(id)
	s.mu.Unlock()
	if ok && a.Context != nil && a.Context.Transport == key.Transport {
		return a, nil
	}
	return s.ownApproval(ctx, id, key)
}

func (s *Server) getApproval(w http.ResponseWriter, r *http.Request, key *Key) error {
	a, err := s.ownApproval(r.Context(), r.PathValue("id"), key)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, approvalView(a).disclosedTo(key))
	return nil
}

// DecisionRequest is the body of POST /v1/approvals/{id}/decisions.
type DecisionRequest struct {
	// Option is one of the approval's options: approve, deny, or a grant
	// option it offers ("approve-<name>", "deny-<name>").
	Option string `json:"option"`
	// ArgsDigest is the args_digest the decider was shown: required.
	ArgsDigest string     `json:"args_digest"`
	Decider    SenderIn   `json:"decider"`
	Channel    *ChannelIn `json:"channel,omitempty"`
	Note       string     `json:"note,omitempty"`
}

// DecisionResponse is the approver's verdict on a decision, or (202)
// "submitted" when it has not answered within Config.DecisionWait (the
// decision is stored and will be applied; with a quorum above one, an
// approve is a vote and the approval stays pending).
type DecisionResponse struct {
	DecisionID string        `json:"decision_id"`
	ApprovalID string        `json:"approval_id"`
	Status     string        `json:"status"`
	Decision   *DecisionView `json:"decision,omitempty"`
}

// postDecision publishes a Decision as a transport does (docs/protocol.md
// §9.2) and answers the approver's verdict. Before publishing it checks
// what it can without deciding: the approval exists for this key's
// transport, the digest is the approval's, the option is offered; a
// failure there is answered with its code and nothing is published.
//
// The verdict is, whichever comes first: the approval's decision when it
// answers d (schemas.DecidedEvent.Answers), taken from the approval record
// as the bucket stores it (a revision heard on the record's subject wakes
// the request, which then reads the record: a write that lost its
// compare-and-set is heard too, and decides nothing); the approval.decided
// event the approver publishes as its answer to a repeat of the recorded
// outcome (Repeat is d); or d's rejection. Another decision that won the
// race is not d's answer (the approver rejects d, 409
// APPROVAL_ALREADY_DECIDED); a counted vote that leaves the approval
// pending is answered when the quorum decides it, or 202 submitted after
// Config.DecisionWait.
func (s *Server) postDecision(w http.ResponseWriter, r *http.Request, key *Key) error {
	var req DecisionRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	idem, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	a, err := s.decisionApproval(r.Context(), r.PathValue("id"), key)
	if err != nil {
		return err
	}
	switch {
	case req.ArgsDigest == "":
		return errorf(http.StatusUnprocessableEntity, schemas.CodeInvalidInput, "args_digest is required: the digest shown to the decider")
	case req.ArgsDigest != a.ArgsDigest:
		return errorf(http.StatusConflict, schemas.CodeArgsDigestMismatch, "args_digest differs from the approval's: the arguments are not the ones shown")
	case !a.Offers(req.Option):
		return errorf(http.StatusUnprocessableEntity, schemas.CodeOptionNotOffered, "option %q: want one of %s", req.Option, strings.Join(a.Options, ", "))
	}
	decider, err := s.decider(key, req.Decider)
	if err != nil {
		return err
	}
	d := &schemas.Decision{
		DecisionID: decisionID(key, a.ApprovalID, idem), ApprovalID: a.ApprovalID, Transport: key.Transport,
		Decider: decider, Option: req.Option, ArgsDigest: req.ArgsDigest, Note: req.Note, SentAt: s.cfg.Now().UTC(),
	}
	if req.Channel != nil {
		d.Channel = &schemas.Channel{ID: req.Channel.ID, Kind: schemas.ChannelKind(req.Channel.Kind), Thread: req.Channel.Thread}
	}
	if _, err := schemas.Encode(d); err != nil {
		return codedInput(err)
	}

	// Wait for the answer before publishing, so that it cannot be missed.
	revisions := topology.ApprovalRevisionSubject(a.ApprovalID)
	answers, stop, err := s.answers.wait(s.cfg.JS.Conn(), decisionAnswerPatterns,
		topology.EventSubject(topology.SubjectDecisionRejected, a.ApprovalID),
		revisions,
		topology.EventSubject(topology.SubjectApprovalDecided, a.TurnID))
	if err != nil {
		return unavailable(err)
	}
	defer stop()
	// A retry of a decision the approver already took answers from the
	// record, at once: its re-sent message would be deduplicated and
	// answered by nothing. Read after subscribing, so that a verdict
	// stored after this read is still heard.
	if idem != "" {
		if done, err := s.retriedDecision(w, r.Context(), d); done || err != nil {
			return err
		}
	}
	if _, err := submit.Decision(r.Context(), s.cfg.JS, d); err != nil {
		return unavailable(err)
	}
	httpserve.Hold(w, r, s.cfg.DecisionWait)
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.DecisionWait)
	defer cancel()
	answer := func(ev *schemas.DecidedEvent) error {
		out := DecisionResponse{DecisionID: d.DecisionID, ApprovalID: a.ApprovalID, Status: string(ev.Status)}
		if ev.Decision != nil {
			dv := decisionView(*ev.Decision)
			out.Decision = &dv
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	var again <-chan time.Time // a read of the record again, while it is not yet stored decided
	var wait time.Duration
	for {
		select {
		case <-ctx.Done():
			writeJSON(w, http.StatusAccepted, DecisionResponse{DecisionID: d.DecisionID, ApprovalID: a.ApprovalID, Status: "submitted"})
			return nil
		case <-again:
		case m := <-answers:
			if m.Subject == revisions {
				if ev, err := store.DecidedOf(m.Subject, m.Header, m.Data); err != nil || ev == nil {
					continue // a pending record (a vote counted), a marker, a rewrite
				}
				break // a decision written: read the record as stored
			}
			_, rec, _ := topology.Read(m.Subject, m.Data, topology.RouteDecisionRejected, topology.RouteApprovalDecided)
			if rej, ok := rec.(*schemas.DecisionRejected); ok {
				if rej.DecisionID != d.DecisionID {
					continue
				}
				return errorf(httpserve.RejectionStatus(rej.Code), rej.Code, "decision %s rejected: %s", d.DecisionID, rej.Reason)
			}
			ev, ok := rec.(*schemas.DecidedEvent)
			if !ok || ev.ApprovalID != a.ApprovalID {
				continue
			}
			// The record as decided, for the turn's next view (see view).
			s.mu.Lock()
			s.approvals.set(a.ApprovalID, a.Decided(ev), recentWrites)
			s.mu.Unlock()
			if !ev.Answers(d) {
				continue // as below: not this request's answer
			}
			// The approver's answer to a repeat (Repeat), or, from an
			// approver that still publishes every decision, the decision.
			return answer(ev)
		}
		// A revision heard is a write sent, not yet a write stored (nor
		// ever, if its compare-and-set lost): the answer is the record
		// as stored.
		again = nil
		stored, _, err := s.store.Approvals.Get(ctx, a.ApprovalID)
		ev := schemas.DecidedOf(stored)
		if err != nil || ev == nil {
			wait = min(max(2*wait, storedRetryFirst), storedRetryMax)
			again = time.After(wait)
			continue
		}
		// The record as decided, for the turn's next view (see view).
		s.mu.Lock()
		s.approvals.set(a.ApprovalID, stored, recentWrites)
		s.mu.Unlock()
		if !ev.Answers(d) {
			// Another decision won the race: not this request's
			// answer. The approver rejects d (409
			// APPROVAL_ALREADY_DECIDED), which comes next.
			continue
		}
		return answer(ev)
	}
}

// decisionAnswerPatterns are the subjects of a decision's answers: its
// rejection (by approval id), its approval record's revisions (by approval
// id: the decision as stored) and its approval's decided events (by turn
// id: the approver's answer to a repeat of the recorded outcome).
var decisionAnswerPatterns = []string{topology.SubjectDecisionRejected + "*", topology.ApprovalRevisions, topology.SubjectApprovalDecided + "*"}

// After a revision heard holds a decision that the record as stored does
// not hold yet, postDecision reads the record again: first after
// storedRetryFirst, doubling up to storedRetryMax.
const (
	storedRetryFirst = 5 * time.Millisecond
	storedRetryMax   = 250 * time.Millisecond
)

// retriedDecision answers d from its approval's record if the approver
// already took a decision with d's id (a retry with the same
// Idempotency-Key) and reports whether it did: 200 with the approval's
// status and decision when the approval is decided, 202 submitted when d
// is a counted vote of an approval still pending; 409
// IDEMPOTENCY_KEY_REUSED when the decision recorded under that id chose
// another option or came from another principal. It answers nothing (and
// the decision is published) when the record holds no decision with d's
// id.
func (s *Server) retriedDecision(w http.ResponseWriter, ctx context.Context, d *schemas.Decision) (bool, error) {
	rec, _, err := s.store.Approvals.Get(ctx, d.ApprovalID)
	if err != nil {
		return false, nil // judged by the approver, as a new decision
	}
	taken := rec.DecisionOf(d.DecisionID)
	switch {
	case taken == nil:
		return false, nil
	case taken.Option != d.Option || taken.Principal != schemas.Principal(d.Transport, d.Decider.ID):
		return true, errorf(http.StatusConflict, CodeIdempotencyKeyReused, "this Idempotency-Key was used for a different decision on approval %s", d.ApprovalID)
	case !rec.Status.Decided():
		writeJSON(w, http.StatusAccepted, DecisionResponse{DecisionID: d.DecisionID, ApprovalID: d.ApprovalID, Status: "submitted"})
		return true, nil
	}
	out := DecisionResponse{DecisionID: d.DecisionID, ApprovalID: d.ApprovalID, Status: string(rec.Status)}
	if rec.Decision != nil {
		dv := decisionView(*rec.Decision)
		out.Decision = &dv
	}
	writeJSON(w, http.StatusOK, out)
	return true, nil
}

// decider builds the wire decider of a decision posted with key. A
// decider whose id is the id of an API key of key's transport is that key
// (the requester of the key's MCP and hook turns is "<transport>:<key
// id>"), and a key is not a person: it is published as kind service,
// whatever the request says, and the approver refuses it with
// DECIDER_NOT_AUTHORIZED (only verified users decide). So an agent's key
// never approves its own gated calls (docs/security.md, "Automation never
// approves itself").
func (s *Server) decider(key *Key, in SenderIn) (schemas.Sender, error) {
	d, err := sender(key, in)
	if k, ok := s.keys[in.ID]; ok && k.Transport == key.Transport {
		d.Kind = schemas.SenderService
	}
	return d, err
}

// decisionID is the id of a decision: derived, when an Idempotency-Key is
// given, from the key's transport, the key's id, the approval and the
// Idempotency-Key (a retry is stored once; the same Idempotency-Key from
// another key or on another approval is another decision), random
// otherwise.
func decisionID(key *Key, approvalID, idem string) string {
	if idem == "" {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return "d-" + hex.EncodeToString(b)
	}
	return "d-" + hashParts(key.Transport, key.ID, approvalID, idem)[:24]
}
