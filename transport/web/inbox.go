package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

// foldAt is the length past which an argument value is folded (shown in a
// <details> element, its start in the summary).
const foldAt = 160

// card is one approval as the inbox shows it.
type card struct {
	ID, TurnID, SessionID, CallID string
	Tool, Digest, PolicyVersion   string
	Args                          []arg
	Requester, RequesterTransport string
	ChannelID, ChannelKind        string
	Audience                      string
	Options                       []string
	// Plain are the options that are not grant options (approve, deny);
	// Offers are the grant options, each with what it would cover and for
	// how long (the approval's GrantOffer summary), shown as buttons of
	// their own. Every one posts through the same form: same digest and
	// CSRF token.
	Plain  []string
	Offers []schemas.GrantOffer
	Quorum int
	Votes  []schemas.DecisionInfo
	// Missing is how many more approvals a quorum needs; StillNeeded who
	// may still give one (the approver's decider rule over the principals
	// the policy names, less those who voted).
	Missing                int
	StillNeeded            []string
	RequestedAt, ExpiresAt time.Time
	Status                 schemas.ApprovalStatus
	// Why says why a card that is not pending is closed: who decided it
	// and when, or that it expired or was abandoned.
	Why string
	// Note is the decider's note kept with the decision (a deny reason,
	// an approve comment), shown through reveal.
	Note string
	// Verdict is the approver's answer to this person's decision, when
	// the card is the answer to one.
	Verdict *verdict
	// Result is the call's result, once its turn has an outcome.
	Result *schemas.ToolResult
	CSRF   string
	// Preview, when set, is rendered by the "preview" template next to
	// the arguments (what the call would change; preview.go); nil:
	// nothing is shown.
	Preview *previewView
	// Warning is reveal.Warning when the call (its arguments, its
	// requester, a grant's summary) holds a character reveal escapes;
	// every such field is shown through reveal.
	Warning string
}

// arg is one top-level argument: its name and pretty JSON value; Short is
// set (the value's start) when the value is folded.
type arg struct {
	Name, Value, Short string
}

// Open reports whether the card can still be decided.
func (c *card) Open() bool { return c.Status == schemas.ApprovalPending }

// newCard is the card of rec for the person of sess, with who a quorum
// still needs.
func (s *Server) newCard(rec *schemas.ApprovalRecord, sess *session) *card {
	c := cardOf(rec, sess)
	if c.Quorum > 1 && c.Open() && rec.Context != nil {
		c.Missing = max(c.Quorum-len(rec.Votes), 0)
		for _, p := range s.cfg.Policy.Candidates(rec.Tool, rec.Context, schemas.AssuranceStrong) {
			if !slices.ContainsFunc(rec.Votes, func(v schemas.DecisionInfo) bool { return v.Principal == p }) {
				c.StillNeeded = append(c.StillNeeded, reveal.Must(p))
			}
		}
	}
	return c
}

// cardOf is the card of rec for the person of sess, without what needs
// the policy (Server.newCard adds it).
func cardOf(rec *schemas.ApprovalRecord, sess *session) *card {
	args, argsFlagged := foldArgs(rec.Args)
	// Every field a person reads on the card goes through sh, which
	// remembers whether one held a character reveal escapes: the session
	// and channel ids raise the warning line as much as the arguments.
	sh := &shower{flagged: argsFlagged}
	c := &card{
		ID: rec.ApprovalID, TurnID: rec.TurnID, SessionID: sh.show(rec.SessionID), CallID: rec.CallID,
		Tool: rec.Tool, Digest: rec.ArgsDigest, PolicyVersion: rec.PolicyVersion, Args: args,
		Options: rec.Options, Quorum: max(rec.Quorum, 1), Votes: rec.Votes,
		RequestedAt: rec.RequestedAt, ExpiresAt: rec.ExpiresAt, Status: rec.Status,
		Preview: previewOf(rec.Preview),
	}
	for _, o := range rec.Options {
		if g, ok := rec.Offer(o); ok && schemas.IsGrantOption(o) {
			g.Option = o
			if g.Summary == "" {
				g.Summary = string(schemas.OptionEffect(o)) + " this call and grant " + o
			}
			g.Summary = sh.show(g.Summary)
			c.Offers = append(c.Offers, g)
			continue
		}
		c.Plain = append(c.Plain, o)
	}
	if tc := rec.Context; tc != nil {
		c.Requester = sh.show(tc.Requester.Principal)
		c.RequesterTransport = tc.Transport
		c.ChannelID, c.ChannelKind, c.Audience = sh.show(tc.Channel.ID), string(tc.Channel.Kind), string(tc.Audience)
	}
	if sess != nil {
		c.CSRF = sess.csrf
	}
	if d := rec.Decision; d != nil && rec.Status.Decided() {
		decider := sh.show(d.Principal)
		c.Why = string(rec.Status) + " by " + decider + " at " + d.DecidedAt.UTC().Format("15:04:05 UTC")
		if d.Grant != nil {
			c.Why = string(rec.Status) + " by grant " + d.Grant.GrantID + " (made by " + decider + ") at " + d.DecidedAt.UTC().Format("15:04:05 UTC")
		}
		c.Note = sh.show(d.Note)
		if rec.Status == schemas.ApprovalExpired {
			c.Why = "expired at " + rec.ExpiresAt.UTC().Format("15:04:05 UTC")
		}
	}
	if sh.flagged {
		c.Warning = reveal.Warning
	}
	return c
}

// shower shows texts through reveal.String and remembers whether any of
// them held a character it escapes.
type shower struct{ flagged bool }

func (s *shower) show(text string) string {
	v, f := reveal.String(text)
	s.flagged = s.flagged || f
	return v
}

// foldArgs splits a call's arguments (a JSON object) into its top-level
// fields, each pretty-printed; a value longer than foldAt is folded. Args
// that are not an object are one field named "(arguments)". Names and
// values are shown through reveal (reveal.String, reveal.JSON); flagged
// reports whether one held a character it escapes.
func foldArgs(args string) (out []arg, flagged bool) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(args), &fields); err != nil {
		a, f := fold("(arguments)", json.RawMessage(args))
		return []arg{a}, f
	}
	names := make([]string, 0, len(fields))
	for n := range fields {
		names = append(names, n)
	}
	slices.Sort(names)
	out = make([]arg, 0, len(names))
	for _, n := range names {
		a, f := fold(n, fields[n])
		out, flagged = append(out, a), flagged || f
	}
	return out, flagged
}

func fold(name string, v json.RawMessage) (arg, bool) {
	var buf bytes.Buffer
	if err := json.Indent(&buf, v, "", "  "); err != nil {
		buf.Reset()
		buf.Write(v)
	}
	shownName, nameFlagged := reveal.String(name)
	value, valueFlagged := reveal.JSON(buf.String())
	a := arg{Name: shownName, Value: value}
	if len(a.Value) > foldAt || strings.Count(a.Value, "\n") > 8 {
		short, _, _ := strings.Cut(a.Value, "\n")
		a.Short = string([]rune(short)[:min(len([]rune(short)), 60)]) + "…"
	}
	return a, nameFlagged || valueFlagged
}

// mayDecide reports whether the person of sess may decide rec: the
// approver's own decider rule, on the decision the inbox would publish.
func (s *Server) mayDecide(rec *schemas.ApprovalRecord, sess *session) error {
	if !sess.SignedIn() {
		return schemas.Errorf(schemas.CodeDeciderNotAuthorized, "not signed in")
	}
	return s.cfg.Policy.MayDecideApproval(rec, Transport, sess.decider(), sess.channel(), s.cfg.Keys)
}

// inbox is the start page: one page of the compact list of the approvals
// waiting for the signed-in person (filters, order and page from the
// query string: readQuery), live; nothing but a sign-in link when signed
// out. The list comes from the process's pending index, never from a scan
// of the bucket.
func (s *Server) inbox(w http.ResponseWriter, r *http.Request) {
	sess := s.current(w, r)
	p := page{Title: "Approvals", Session: sess, Dev: s.cfg.DevSignIn}
	if sess.SignedIn() {
		// The stream position is read before the index catches up with the
		// bucket, and an approval is stored before it is announced, so the
		// live stream starts no later than the list: nothing falls between
		// them.
		pos, err := s.feed.Position(r.Context())
		if err != nil {
			s.message(w, r, http.StatusServiceUnavailable, "Unavailable", "", "The events stream cannot be read: try again.")
			return
		}
		p.Live, p.After = true, pos.String()
		if err := s.index.sync(r.Context()); err != nil {
			s.cfg.Logger.Warn("web: the inbox is listed from a pending index that is behind", "err", err)
		}
		p.List = s.list(s.index.all(), sess, readQuery(w, r, s.cfg.SecureCookies))
		p.Count = p.List.Total
	}
	s.render(w, r, http.StatusOK, "inbox", p)
}

// approval is an approval's own page: its full card, to a person who may
// decide it (anyone else, and an unknown id, get the same 404). With the
// header Tollgate-Fragment the answer is the card alone (inbox.js opens a
// row with it).
func (s *Server) approval(w http.ResponseWriter, r *http.Request) {
	sess := s.current(w, r)
	id := r.PathValue("id")
	var rec *schemas.ApprovalRecord
	var err error
	if schemas.ValidKey(id) && sess.SignedIn() {
		rec, _, err = s.store.Approvals.Get(r.Context(), id)
	}
	switch {
	case rec != nil && err == nil && s.mayDecide(rec, sess) == nil:
	case err != nil && !errors.Is(err, store.ErrNotFound) && schemas.CodeOf(err) == "":
		s.message(w, r, http.StatusServiceUnavailable, "Unavailable", string(CodeUnavailable), "The approval cannot be read: try again.")
		return
	default:
		s.message(w, r, http.StatusNotFound, "Not found", string(schemas.CodeApprovalNotFound), "There is no such approval waiting for you.")
		return
	}
	c := s.newCard(rec, sess)
	if r.Header.Get(fragmentHeader) != "" {
		s.fragment(w, http.StatusOK, c)
		return
	}
	s.render(w, r, http.StatusOK, "approval", page{Title: "Approval", Session: sess, Cards: []*card{c}})
}

// signInPage offers the sign-in methods that are on.
func (s *Server) signInPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "signin", page{Title: "Sign in", Session: s.current(w, r), Dev: s.cfg.DevSignIn, OIDC: s.oidc != nil})
}

// subjectPattern is what a dev sign-in subject may be.
var subjectPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// devSignIn signs in as the subject the form names: only with dev sign-in
// on, only for a request that arrived on a loopback address from one, and
// only with the CSRF token of the browser's sign-in cookie (or of its
// session, to sign in as someone else).
func (s *Server) devSignIn(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.DevSignIn || !loopbackRequest(r) {
		s.message(w, r, http.StatusNotFound, "Not found", "", "Dev sign-in is off.")
		return
	}
	sess := s.form(r)
	if !validCSRF(sess, r) {
		s.message(w, r, http.StatusForbidden, "Forbidden", string(CodeCSRFInvalid), "The form's security token is missing or stale: reload the page and try again.")
		return
	}
	subject := strings.TrimSpace(r.PostFormValue("subject"))
	if !subjectPattern.MatchString(subject) {
		s.message(w, r, http.StatusBadRequest, "Sign in", string(schemas.CodeInvalidInput), "A subject is 1 to 64 letters, digits and . _ @ -, starting with a letter or digit.")
		return
	}
	s.sessions.end(r.Context(), w, sess)
	clearVisitor(w)
	if s.sessions.start(r.Context(), w, r, s.cfg.SecureCookies, subject, subject, r.PostFormValue("strong") == "on") == nil {
		s.message(w, r, http.StatusServiceUnavailable, "Unavailable", string(CodeUnavailable), "The session could not be stored: try again.")
		return
	}
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// loopbackRequest reports whether r arrived on a loopback address from a
// loopback address.
func loopbackRequest(r *http.Request) bool {
	local, _ := r.Context().Value(http.LocalAddrContextKey).(interface{ String() string })
	return local != nil && LoopbackAddr(local.String()) && LoopbackAddr(r.RemoteAddr)
}

// signOut ends the session, in every process; with the form field
// everywhere=1, every other session of the person too (all their
// browsers). It is the only way a session ends before its time: a POST
// with the session's CSRF token (no GET signs anyone out).
func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	sess := s.form(r)
	if !validCSRF(sess, r) {
		s.message(w, r, http.StatusForbidden, "Forbidden", string(CodeCSRFInvalid), "The form's security token is missing or stale: reload the page and try again.")
		return
	}
	if r.PostFormValue("everywhere") == "1" && sess.SignedIn() {
		if err := s.sessions.endEverywhere(r.Context(), sess.subject); err != nil {
			s.message(w, r, http.StatusServiceUnavailable, "Unavailable", string(CodeUnavailable), "Your sessions could not be ended: try again.")
			return
		}
	}
	s.sessions.end(r.Context(), w, sess)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// sessionState answers whether the request's session is live: 204 when
// signed in, else 401 with Tollgate-Code SIGNED_OUT. The open page asks it
// when its live stream breaks, to tell a restart or another replica (it
// reconnects) from a session that has ended (it says so).
func (s *Server) sessionState(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if !s.sessions.get(r).SignedIn() {
		w.Header().Set("Tollgate-Code", string(CodeSignedOut))
		http.Error(w, string(CodeSignedOut), http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
