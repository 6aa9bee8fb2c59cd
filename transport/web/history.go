package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/audit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// historyWindow is how far back the history page reads when no since is
// given.
const historyWindow = 24 * time.Hour

// visible keeps the events the person of sess may see: those of an
// approval whose requested record MayDecide accepts them for (the people
// who were shown the prompt), and the turn-level events (accepted,
// redrives, results of calls without approval, outcome) of a turn with
// such an approval. Everything else is dropped, so history never shows
// more than the inbox did.
//
// An approval whose requested event is not among events (requested before
// the time range read) is judged by its record in the approvals bucket.
func (s *Server) visible(ctx context.Context, events []audit.Event, sess *session) []audit.Event {
	approvals, turns := map[string]bool{}, map[string]bool{}
	for _, e := range events {
		if e.Kind == audit.Requested && e.Record != nil {
			approvals[e.ApprovalID] = s.mayDecide(e.Record, sess) == nil
			turns[e.TurnID] = turns[e.TurnID] || approvals[e.ApprovalID]
		}
	}
	for _, e := range events {
		if _, seen := approvals[e.ApprovalID]; e.ApprovalID == "" || seen {
			continue
		}
		rec, _, err := s.store.Approvals.Get(ctx, e.ApprovalID)
		approvals[e.ApprovalID] = err == nil && s.mayDecide(rec, sess) == nil
		if approvals[e.ApprovalID] {
			turns[e.TurnID] = true
		}
	}
	return slices.DeleteFunc(slices.Clone(events), func(e audit.Event) bool {
		if e.ApprovalID != "" {
			return !approvals[e.ApprovalID]
		}
		return !turns[e.TurnID]
	})
}

// read returns the events q selects that the person of sess may see. The
// streams are read for q's turn and time range alone: which approvals the
// person may see is known from their requested events, which q's other
// filters (principal, tool, session) could leave out.
func (s *Server) read(r *http.Request, q audit.Query, sess *session) ([]audit.Event, error) {
	all, err := audit.Read(r.Context(), s.cfg.JS, audit.Query{Turn: q.Turn, Since: q.Since, Until: q.Until}, s.cfg.Logger)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(s.visible(r.Context(), all, sess), func(e audit.Event) bool { return !q.Matches(e) }), nil
}

// requireSignIn sends a visitor who is not signed in to the sign-in page.
func (s *Server) requireSignIn(w http.ResponseWriter, r *http.Request) *session {
	sess := s.sessions.get(r)
	if !sess.SignedIn() {
		http.Redirect(w, r, "/signin", http.StatusSeeOther)
		return nil
	}
	return sess
}

// turn shows the timeline of one turn, read from the streams: accepted,
// approvals requested, decisions (principal, transport, time), refusals,
// redrives, results, outcome. 404 unless the person may decide one of its
// approvals.
func (s *Server) turn(w http.ResponseWriter, r *http.Request) {
	sess := s.requireSignIn(w, r)
	if sess == nil {
		return
	}
	id := r.PathValue("id")
	var events []audit.Event
	if schemas.ValidKey(id) {
		var err error
		if events, err = s.read(r, audit.Query{Turn: id}, sess); err != nil {
			s.message(w, r, http.StatusServiceUnavailable, "Unavailable", string(CodeUnavailable), "The streams cannot be read: try again.")
			return
		}
	}
	if len(events) == 0 {
		s.message(w, r, http.StatusNotFound, "Not found", string(schemas.CodeApprovalNotFound), "There is no turn "+id+" with an approval you may decide.")
		return
	}
	s.render(w, r, http.StatusOK, "turn", page{Title: "Turn " + id, Session: sess, Events: events, Query: url.Values{"turn": {id}}.Encode()})
}

// historyQuery reads the filters of /history and /history.jsonl:
// principal, tool, session, turn, since and until (RFC 3339, or a
// browser's datetime-local value, taken as UTC); since defaults to 24
// hours ago, or to the start of the streams for one turn.
func (s *Server) historyQuery(r *http.Request) (audit.Query, error) {
	v := r.URL.Query()
	q := audit.Query{Principal: v.Get("principal"), Tool: v.Get("tool"), Session: v.Get("session"), Turn: v.Get("turn")}
	switch {
	case q.Turn != "" && !schemas.ValidKey(q.Turn):
		return q, schemas.Errorf(schemas.CodeInvalidInput, "turn: want a turn id")
	case q.Turn == "":
		q.Since = s.cfg.Now().Add(-historyWindow)
	}
	for name, to := range map[string]*time.Time{"since": &q.Since, "until": &q.Until} {
		if t := v.Get(name); t != "" {
			at, err := parseTime(t)
			if err != nil {
				return q, schemas.Errorf(schemas.CodeInvalidInput, "%s: want a time such as 2026-01-02T15:04:05Z", name)
			}
			*to = at
		}
	}
	return q, nil
}

func parseTime(v string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.Parse("2006-01-02T15:04", v)
}

// history lists past decisions (decided and refused) the person may see,
// newest first, with the filters of historyQuery.
func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	sess := s.requireSignIn(w, r)
	if sess == nil {
		return
	}
	q, err := s.historyQuery(r)
	if err != nil {
		s.message(w, r, http.StatusBadRequest, "History", string(schemas.CodeInvalidInput), err.Error())
		return
	}
	events, err := s.read(r, q, sess)
	if err != nil {
		s.message(w, r, http.StatusServiceUnavailable, "Unavailable", string(CodeUnavailable), "The streams cannot be read: try again.")
		return
	}
	events = slices.DeleteFunc(events, func(e audit.Event) bool { return e.Kind != audit.Decided && e.Kind != audit.Rejected })
	slices.Reverse(events)
	s.render(w, r, http.StatusOK, "history", page{Title: "History", Session: sess, Events: events, Filter: r.URL.Query(), Query: r.URL.RawQuery})
}

// export writes every event of the filtered timeline the person may see
// (not only decisions) as JSON lines, oldest first.
func (s *Server) export(w http.ResponseWriter, r *http.Request) {
	sess := s.sessions.get(r)
	if !sess.SignedIn() {
		http.Error(w, string(CodeSignedOut), http.StatusUnauthorized)
		return
	}
	q, err := s.historyQuery(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	events, err := s.read(r, q, sess)
	if err != nil {
		http.Error(w, string(CodeUnavailable), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/jsonl; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="tollgate-history.jsonl"`)
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	for _, e := range events {
		if err := enc.Encode(e); err != nil {
			return
		}
	}
}
