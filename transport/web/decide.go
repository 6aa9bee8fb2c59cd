package web

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// Reason codes of the inbox's own refusals (the approver's are schemas').
const (
	CodeCSRFInvalid schemas.Code = "CSRF_INVALID" // the form's CSRF token is not the session's
	CodeSignedOut   schemas.Code = "SIGNED_OUT"   // no live session: signed out, expired or a bad cookie
	CodeRateLimited schemas.Code = "RATE_LIMITED" // the principal is over its decision rate
	CodeUnavailable schemas.Code = "UNAVAILABLE"  // the bus or the store could not be reached
)

const (
	// fragmentHeader is set by inbox.js: answer a decision with the card alone.
	fragmentHeader = "Tollgate-Fragment"
	maxNoteBytes   = 1000
)

// Verdict states.
const (
	VerdictApplied   = "applied"   // the decision moved the approval out of pending
	VerdictVote      = "vote"      // an approve counted towards a quorum not yet reached
	VerdictRejected  = "rejected"  // refused, with Code
	VerdictSubmitted = "submitted" // stored; the approver did not answer within DecisionWait
)

// verdict is what became of a person's decision.
type verdict struct {
	State  string
	Option string
	Code   schemas.Code
	Reason string
}

// decisionID is the id of the decision of principal choosing option on
// approval id bound to digest: the same click, made twice, is one decision
// (the bus drops the second publish within its duplicate window, and the
// approver answers a repeat as idempotent after it).
func decisionID(principal, id, option, digest string) string {
	h := sha256.Sum256([]byte(Transport + "\x00" + principal + "\x00" + id + "\x00" + option + "\x00" + digest))
	return "d-" + hex.EncodeToString(h[:12])
}

// decide publishes the signed-in person's decision on approval {id} and
// shows the approver's verdict. Before publishing it refuses, with a code
// and without publishing: no live session (401 SIGNED_OUT), a CSRF token
// that is not the session's (403 CSRF_INVALID), the principal over its rate
// (429 RATE_LIMITED), an unknown approval (404), a digest other than the
// approval's (409 ARGS_DIGEST_MISMATCH), a person MayDecide refuses (403
// DECIDER_NOT_AUTHORIZED) and an option not offered (422). The approver
// checks everything again.
func (s *Server) decide(w http.ResponseWriter, r *http.Request) {
	sess := s.formSession(w, r, "decide", "decisions")
	if sess == nil {
		return
	}
	id := r.PathValue("id")
	var rec *schemas.ApprovalRecord
	var err error
	if schemas.ValidKey(id) {
		rec, _, err = s.store.Approvals.Get(r.Context(), id)
	}
	switch {
	case !schemas.ValidKey(id) || errors.Is(err, store.ErrNotFound) || schemas.CodeOf(err) != "":
		s.refuse(w, r, nil, http.StatusNotFound, schemas.CodeApprovalNotFound, "There is no such approval.")
		return
	case err != nil:
		s.refuse(w, r, nil, http.StatusServiceUnavailable, CodeUnavailable, "The approval cannot be read: try again.")
		return
	}
	option, digest, note := r.PostFormValue("option"), r.PostFormValue("digest"), r.PostFormValue("note")
	if err := s.mayDecide(rec, sess); err != nil {
		s.refuse(w, r, nil, http.StatusForbidden, schemas.CodeDeciderNotAuthorized, "You may not decide this approval.")
		return
	}
	c := s.newCard(rec, sess)
	switch {
	case digest != rec.ArgsDigest:
		s.refuse(w, r, c, http.StatusConflict, schemas.CodeArgsDigestMismatch, "The arguments you were shown are not the ones this approval binds: nothing was decided.")
		return
	case !rec.Offers(option):
		s.refuse(w, r, c, http.StatusUnprocessableEntity, schemas.CodeOptionNotOffered, fmt.Sprintf("%q is not one of the options offered.", option))
		return
	case len(note) > maxNoteBytes:
		s.refuse(w, r, c, http.StatusRequestEntityTooLarge, schemas.CodePayloadTooLarge, fmt.Sprintf("The note is over %d bytes.", maxNoteBytes))
		return
	}
	d := &schemas.Decision{
		DecisionID: decisionID(sess.Principal(), id, option, digest), ApprovalID: id, Transport: Transport,
		Decider: sess.decider(), Channel: sess.channel(), Option: option, ArgsDigest: digest, Note: note,
		SentAt: s.cfg.Now().UTC(),
	}
	v, err := s.submit(r.Context(), rec, d)
	if err != nil {
		s.cfg.Logger.Error("web: decision", "approval", id, "err", err)
		s.refuse(w, r, c, http.StatusServiceUnavailable, CodeUnavailable, "The decision could not be sent: try again.")
		return
	}
	if now, _, err := s.store.Approvals.Get(r.Context(), id); err == nil {
		c = s.newCard(now, sess)
	}
	c.Verdict = v
	status := http.StatusOK
	if v.State == VerdictRejected {
		status = httpserve.RejectionStatus(v.Code)
	}
	s.answer(w, r, status, c)
}

// submit publishes d and returns the approver's verdict: its rejection of
// d; the approval record as stored when it holds d (applied, or a vote
// counted while the approval stays pending), read at once when a revision
// of the record is heard (a revision heard is a write sent, not yet a write
// stored, nor ever if its compare-and-set lost, so only the read answers)
// and every pollEvery besides; the approval.decided event that answers d
// (DecidedEvent.Answers: the approver's answer to a repeat of the recorded
// outcome carries d's id in Repeat); or, when none of these comes within
// DecisionWait, submitted.
func (s *Server) submit(ctx context.Context, rec *schemas.ApprovalRecord, d *schemas.Decision) (*verdict, error) {
	v := &verdict{Option: d.Option}
	// A decision the record already holds (a resubmit after the bus's
	// duplicate window) is answered from the record.
	if rec.Holds(d.DecisionID) {
		v.State = VerdictApplied
		if rec.Status == schemas.ApprovalPending {
			v.State = VerdictVote
		}
		return v, nil
	}
	revisions := topology.ApprovalRevisionSubject(d.ApprovalID)
	answers, stop, err := s.publishDecision(ctx, d,
		topology.EventSubject(topology.SubjectDecisionRejected, d.ApprovalID),
		revisions,
		topology.EventSubject(topology.SubjectApprovalDecided, rec.TurnID))
	if err != nil {
		return nil, err
	}
	defer stop()
	wait, cancel := context.WithTimeout(ctx, s.cfg.DecisionWait)
	defer cancel()
	poll := time.NewTicker(pollEvery)
	defer poll.Stop()
	// recorded reports whether the record as stored holds d, and sets v
	// from it.
	recorded := func() bool {
		now, _, err := s.store.Approvals.Get(ctx, d.ApprovalID)
		if err != nil || !now.Holds(d.DecisionID) {
			return false
		}
		v.State = VerdictApplied
		if now.Status == schemas.ApprovalPending {
			v.State = VerdictVote
		}
		return true
	}
	for {
		select {
		case <-wait.Done():
			v.State = VerdictSubmitted
			return v, nil
		case <-poll.C:
			// A duplicate publish is answered by nobody: the record tells.
			if recorded() {
				return v, nil
			}
		case m := <-answers:
			if m.Subject == revisions {
				if recorded() {
					return v, nil
				}
				continue
			}
			_, rec, _ := topology.Read(m.Subject, m.Data, topology.RouteDecisionRejected, topology.RouteApprovalDecided)
			if rej, ok := rec.(*schemas.DecisionRejected); ok {
				if rej.DecisionID != d.DecisionID {
					continue
				}
				v.State, v.Code, v.Reason = VerdictRejected, rej.Code, rej.Reason
				return v, nil
			}
			ev, ok := rec.(*schemas.DecidedEvent)
			if !ok || ev.ApprovalID != d.ApprovalID || ev.Decision == nil {
				continue
			}
			if ev.Answers(d) {
				v.State = VerdictApplied
				return v, nil
			}
		}
	}
}

// pollEvery is how often submit reads the approval record while it waits
// for its decision's verdict.
const pollEvery = 250 * time.Millisecond

// formSession admits a form post that changes something (a decision, a
// revocation): its body bounded, a live session, the session's CSRF token,
// the principal within its rate. Otherwise it refuses, with a code and
// nothing changed (401 SIGNED_OUT, 403 CSRF_INVALID, 429 RATE_LIMITED with
// Retry-After), and returns nil. action ("decide") and what ("decisions")
// word the refusals.
func (s *Server) formSession(w http.ResponseWriter, r *http.Request, action, what string) *session {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	sess := s.sessions.get(r)
	switch {
	case !sess.SignedIn():
		s.refuse(w, r, nil, http.StatusUnauthorized, CodeSignedOut, "You are signed out: sign in again to "+action+".")
		return nil
	case !validCSRF(sess, r):
		s.refuse(w, r, nil, http.StatusForbidden, CodeCSRFInvalid, "The form's security token is not this session's: reload the page and try again.")
		return nil
	case !s.limiter(sess.Principal()).Allow():
		w.Header().Set("Retry-After", "1")
		s.refuse(w, r, nil, http.StatusTooManyRequests, CodeRateLimited, "Too many "+what+": wait a moment and try again.")
		return nil
	}
	return sess
}

// publishDecision publishes d on its transport's decision subject, having
// subscribed first (so that no answer can be missed) to the subjects its
// answers come on, and returns the answers and the function that ends the
// subscriptions.
func (s *Server) publishDecision(ctx context.Context, d *schemas.Decision, answerSubjects ...string) (<-chan *nats.Msg, func(), error) {
	nc := s.cfg.JS.Conn()
	answers := make(chan *nats.Msg, 64)
	var subs []*nats.Subscription
	stop := func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}
	for _, subj := range answerSubjects {
		sub, err := nc.ChanSubscribe(subj, answers)
		if err != nil {
			stop()
			return nil, nil, err
		}
		subs = append(subs, sub)
	}
	fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
	defer fcancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		stop()
		return nil, nil, err
	}
	if _, err := submit.Decision(ctx, s.cfg.JS, d); err != nil {
		stop()
		return nil, nil, err
	}
	return answers, stop, nil
}

// refuse answers a decision the inbox did not publish: with the card (when
// the person may see it) carrying the refusal, or a message page.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, c *card, status int, code schemas.Code, msg string) {
	if c == nil {
		w.Header().Set("Tollgate-Code", string(code))
		if r.Header.Get(fragmentHeader) != "" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(status)
			_, _ = fmt.Fprintf(w, "%s: %s", code, msg)
			return
		}
		s.message(w, r, status, "Not decided", string(code), msg)
		return
	}
	c.Verdict = &verdict{State: VerdictRejected, Code: code, Reason: msg}
	s.answer(w, r, status, c)
}

// answer writes card c: alone for inbox.js, else in a page of its own.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, status int, c *card) {
	if c.Verdict != nil && c.Verdict.Code != "" {
		w.Header().Set("Tollgate-Code", string(c.Verdict.Code))
	}
	w.Header().Set("Tollgate-Verdict", c.Verdict.State)
	if r.Header.Get(fragmentHeader) == "" {
		s.render(w, r, status, "approval", page{Title: "Decision", Cards: []*card{c}})
		return
	}
	s.fragment(w, status, c)
}

// fragment answers with card c alone, as HTML.
func (s *Server) fragment(w http.ResponseWriter, status int, c *card) {
	html, err := s.renderCard(c)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(html))
}
