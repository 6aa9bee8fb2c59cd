package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

// SSE event names of /events. Each carries one card as HTML (rendered by
// the templates, like the page), with id = the event feed's cursor after
// the event it comes from (eventfeed.Cursor).
const (
	eventPrompt    = "prompt"    // a new approval the person may decide: its row (the card in it), to insert
	eventUpdate    = "update"    // a card changed (a quorum vote, decided, expired, abandoned, its call's result): replace it
	eventSignedOut = "signedout" // the session ended: the stream stops
)

// startAfter is the position the live stream starts after: the
// Last-Event-ID header (a reconnecting EventSource sends it), else ?after=
// (the page's position when it was rendered: eventfeed.Feed.Position, the
// approvals bucket's place included, so a decision stored after the page
// was read comes live); an eventfeed.Cursor, one of an earlier version
// (without the approvals bucket's place, or a bare events stream
// sequence) resuming too.
func startAfter(r *http.Request) (eventfeed.Cursor, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("after")
	}
	return eventfeed.ParseCursor(v)
}

// live streams Server-Sent Events from the process's event feed, after
// the position startAfter gives, to a signed-in person: a prompt for each
// new approval they may decide, an update when one of those is decided,
// expires or is abandoned (the feed's approval.decided: the decision's
// revision in the approvals bucket, or an answer to a repeated decision),
// or its turn ends. Each event's id is the feed's
// cursor after it, so a client that reconnects with Last-Event-ID misses nothing.
// The stream ends (after a signedout event) when the session does, and
// ends plainly when the browser falls behind the feed (it reconnects and
// resumes). A person holds at most Config.MaxStreams streams open at once:
// one more is 429 TOO_MANY_STREAMS.
func (s *Server) live(w http.ResponseWriter, r *http.Request) {
	sess := s.sessions.get(r)
	if !sess.SignedIn() {
		http.Error(w, string(CodeSignedOut), http.StatusUnauthorized)
		return
	}
	after, err := startAfter(r)
	if err != nil {
		http.Error(w, "want Last-Event-ID or ?after=<event id>: "+schemas.ReasonOf(err), http.StatusBadRequest)
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ctx := r.Context()
	sub, err := s.feed.Subscribe(ctx, eventfeed.Options{
		Filters: []string{topology.SubjectApprovalRequested + "*", topology.SubjectApprovalDecided + "*", topology.SubjectApprovalVoted + "*", topology.SubjectTurnOutcome + "*"},
		After:   after, Owner: sess.Principal(), Max: s.cfg.MaxStreams,
	})
	switch {
	case errors.Is(err, eventfeed.ErrTooManyStreams):
		w.Header().Set("Retry-After", "5")
		w.Header().Set("Tollgate-Code", string(eventfeed.CodeTooManyStreams))
		http.Error(w, string(eventfeed.CodeTooManyStreams), http.StatusTooManyRequests)
		return
	case schemas.CodeOf(err) == schemas.CodeInvalidInput:
		http.Error(w, "want Last-Event-ID or ?after=<event id>: "+schemas.ReasonOf(err), http.StatusBadRequest)
		return
	case err != nil:
		http.Error(w, string(CodeUnavailable), http.StatusServiceUnavailable)
		return
	}
	defer sub.Close()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	httpserve.Hold(w, r, 0) // and before each write: a stream, no write timeout
	w.WriteHeader(http.StatusOK)
	// retry: a browser whose stream broke (a restart, another replica)
	// reconnects after a second, with Last-Event-ID.
	_, _ = fmt.Fprint(w, ": tollgate inbox\nretry: 1000\n\n")
	fl.Flush()
	// ended is cancelled the moment the session ends: signed out (here or
	// in any process), signed out everywhere, or expired.
	ended := s.watchSession(ctx, sess)
	mine := map[string]bool{} // approval id -> the person may decide it
	// The next heartbeat is due Heartbeat after the last write, whatever
	// events concern none of this person's approvals in between.
	beat := time.Now().Add(s.cfg.Heartbeat)
	for {
		wait, cancel := context.WithDeadline(ended, beat)
		m, err := sub.Next(wait)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case ended.Err() != nil || s.sessions.reload(r) == nil:
			_, _ = fmt.Fprintf(w, "event: %s\ndata: \n\n", eventSignedOut)
			fl.Flush()
			return
		case errors.Is(err, context.DeadlineExceeded):
			httpserve.Hold(w, r, 0)
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return
			}
			fl.Flush()
			beat = time.Now().Add(s.cfg.Heartbeat)
			continue
		case err != nil:
			return // cut off: the browser reconnects with Last-Event-ID
		}
		name, cards := s.liveCards(ctx, m, sess, mine)
		var b strings.Builder
		for _, html := range cards {
			fmt.Fprintf(&b, "id: %s\nevent: %s\n", m.ID, name)
			for _, line := range strings.Split(html, "\n") {
				fmt.Fprintf(&b, "data: %s\n", line)
			}
			b.WriteString("\n")
		}
		if b.Len() == 0 {
			continue
		}
		httpserve.Hold(w, r, 0)
		if _, err := fmt.Fprint(w, b.String()); err != nil {
			return
		}
		fl.Flush()
		beat = time.Now().Add(s.cfg.Heartbeat)
	}
}

// watchSession returns a context that is cancelled when ctx is or when
// the session sess ends: its record or its person's sign-out-everywhere
// record changes in the sessions bucket (whichever process changed it)
// and the session no longer loads, or its expiry passes.
//
// The watch need not see every revision, and does not: a KV purge is a
// rollup that deletes the key's earlier revisions, so a watch that lags
// behind the writes skips a revision a later purge deleted (issue 35
// traced TestLeastPrivilegeGatewayKeepsWebSessions's rare failure to
// exactly that, in the test's expectations, not in nats.go, nats-server
// or here). A key's latest revision is never deleted by an earlier
// write, so the watch always sees the last change of both keys: the
// purge that signs the session out, the revoke record that signs the
// person out everywhere. Any change makes it load the session again,
// and the stream's heartbeat loads it as well, so no skipped revision
// keeps a signed-out page live.
func (s *Server) watchSession(ctx context.Context, sess *session) context.Context {
	ended, end := context.WithCancel(ctx)
	w, err := s.sessions.kv.WatchFiltered(ended, []string{sess.key, revokedKey(sess.subject)}, jetstream.UpdatesOnly())
	if err != nil {
		s.cfg.Logger.Warn("web: cannot watch the session; the heartbeat checks it", "err", err)
	}
	go func() {
		defer end()
		expiry := time.NewTimer(sess.expires.Sub(s.cfg.Now()))
		defer expiry.Stop()
		var updates <-chan jetstream.KeyValueEntry
		if w != nil {
			updates = w.Updates()
			defer func() { _ = w.Stop() }()
		}
		for {
			select {
			case <-ended.Done():
				return
			case <-expiry.C:
				return
			case _, ok := <-updates:
				if !ok {
					updates = nil // the heartbeat still checks
					continue
				}
				if s.sessions.load(ended, sess.id) == nil && ended.Err() == nil {
					return
				}
			}
		}
	}()
	return ended
}

// liveCards are the SSE events (name and the cards' HTML) that stored
// event m is for the person of sess; none when it concerns none of theirs.
func (s *Server) liveCards(ctx context.Context, m eventfeed.Event, sess *session, mine map[string]bool) (name string, html []string) {
	var cards []*card
	_, rec, _ := topology.Read(m.Subject, m.Data, topology.RouteApprovalRequested, topology.RouteApprovalDecided, topology.RouteApprovalVoted, topology.RouteTurnOutcome)
	switch rec := rec.(type) {
	case *schemas.ApprovalRecord:
		// An approval requested already decided (by a standing grant)
		// prompts nobody: it is not shown, nor are its updates.
		mine[rec.ApprovalID] = rec.Status == schemas.ApprovalPending && s.mayDecide(rec, sess) == nil
		if !mine[rec.ApprovalID] {
			return "", nil
		}
		// The event carries the preview summary-only (docs/security.md
		// rule 17); a decider's card shows the stored one, whole.
		if rec.Preview != nil && rec.Preview.Redacted {
			if stored, _, err := s.store.Approvals.Get(ctx, rec.ApprovalID); err == nil && stored.Preview != nil {
				shown := *rec
				shown.Preview = stored.Preview
				rec = &shown
			}
		}
		// A prompt is the approval's row in the list, its card in it.
		rw := rowOf(rec)
		rw.Card = s.newCard(rec, sess)
		h, err := s.renderRow(rw)
		if err != nil {
			s.cfg.Logger.Error("web: render row", "approval", rec.ApprovalID, "err", err)
			return "", nil
		}
		return eventPrompt, []string{h}
	case *schemas.DecidedEvent:
		name = eventUpdate
		if c := s.currentCard(ctx, rec.ApprovalID, sess, mine); c != nil {
			cards = append(cards, c)
		}
	case *schemas.VotedEvent:
		name = eventUpdate
		if c := s.currentCard(ctx, rec.ApprovalID, sess, mine); c != nil {
			cards = append(cards, c)
		}
	case *schemas.TurnOutcome:
		for i := range rec.Results {
			res := &rec.Results[i]
			if res.ApprovalID == "" {
				continue
			}
			if c := s.currentCard(ctx, res.ApprovalID, sess, mine); c != nil {
				c.Result = res
				cards = append(cards, c)
			}
		}
		name = eventUpdate
	}
	for _, c := range cards {
		h, err := s.renderCard(c)
		if err != nil {
			s.cfg.Logger.Error("web: render card", "approval", c.ID, "err", err)
			continue
		}
		html = append(html, h)
	}
	return name, html
}

// currentCard is the card of approval id as stored now, if the person of
// sess may decide it (remembered in mine); nil otherwise.
func (s *Server) currentCard(ctx context.Context, id string, sess *session, mine map[string]bool) *card {
	if ok, seen := mine[id]; seen && !ok {
		return nil
	}
	rec, _, err := s.store.Approvals.Get(ctx, id)
	if err != nil {
		return nil
	}
	if _, seen := mine[id]; !seen {
		mine[id] = s.mayDecide(rec, sess) == nil
	}
	if !mine[id] {
		return nil
	}
	return s.newCard(rec, sess)
}
