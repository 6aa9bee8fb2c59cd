package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

// eventPrefix starts every subject of TOLLGATE_EVENTS.
const eventPrefix = "tollgate.event."

// event is one stored event as an SSE message: id is the feed's cursor
// after it (eventfeed.Cursor: the events stream's sequence, then each
// turn-log partition's, then the approvals bucket's, dot-separated;
// opaque to clients), kind the subject without prefix and last token
// (approval.requested, approval.decided, redrive.deferred, turn.outcome,
// ...), data the payload as JSON with the wire field names of
// docs/protocol.md §6.
//
// The streams are of TOLLGATE_EVENTS, of the turns' requests and
// outcomes, which the feed reads from the turn logs, and of the
// approvals' decisions, which it reads from the approvals bucket
// (transport/eventfeed): each as the event it replaces, byte for byte, so
// a client sees the same approval.requested, approval.decided and
// turn.outcome events whichever stream keeps them. A turn of this version
// has no batch.awaiting and no redrive.started event (issue 36: its moves
// to awaiting and to started are writes of its turn's log, which no
// stream here follows): approval.requested tells a client that the turn
// waits, and GET /v1/turns/{id} (with ?wait=) or turn.outcome that it
// moved on. Both kinds still come for a turn of an earlier version (and a
// batch.awaiting for `tollgate replay`'s nudges), and pass as any event.
type event struct {
	id      string
	kind    string
	subject string
	payload map[string]any
}

// lastEventID reads Last-Event-ID (header, or ?last_event_id= for clients
// that cannot set headers): the id of the last event the client has (an
// eventfeed.Cursor; an id of an earlier version, without the approvals
// bucket's place or a bare TOLLGATE_EVENTS sequence, resumes too); nil
// when absent. A value that is not an id is INVALID_INPUT (one beyond a
// stream's last message, or naming another number of streams, is refused
// by the feed, also INVALID_INPUT).
func lastEventID(r *http.Request) (eventfeed.Cursor, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		return nil, nil
	}
	c, err := eventfeed.ParseCursor(v)
	if err != nil {
		return nil, errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "Last-Event-ID: want the id of an event as it was sent (%s)", schemas.ReasonOf(err))
	}
	return c, nil
}

// streamEvents serves Server-Sent Events from the process's event feed:
// the events on filter after Last-Event-ID (from the start of the stream
// when fromStart and no Last-Event-ID is given, else only new ones), those
// keep accepts, each with id = the feed's cursor after it, so a client that
// reconnects with Last-Event-ID misses nothing. A comment line is sent
// after each Config.Heartbeat without an event. It returns when the client
// goes away, or when the client falls behind the feed (the response ends;
// the client resumes with Last-Event-ID). The key holds at most
// Config.MaxStreams streams at once: one more is 429 TOO_MANY_STREAMS.
//
// When last is not nil, the response ends after the first event that last
// accepts (a turn's stream: its outcome).
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, key *Key, filter string, fromStart bool, keep, last func(*event) bool) error {
	after, err := lastEventID(r)
	if err != nil {
		return err
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		return errors.New("gateway: streaming unsupported by the response writer")
	}
	ctx := r.Context()
	sub, err := s.events.Subscribe(ctx, eventfeed.Options{
		Filters: []string{filter}, After: after, New: after == nil && !fromStart,
		Owner: "gateway:" + key.ID, Max: s.cfg.MaxStreams,
	})
	switch {
	case errors.Is(err, eventfeed.ErrTooManyStreams):
		return errorf(http.StatusTooManyRequests, CodeTooManyStreams, "API key %s already holds %d event streams open (the most it may)", key.ID, s.cfg.MaxStreams)
	case schemas.CodeOf(err) == schemas.CodeInvalidInput:
		return errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "Last-Event-ID: %s", schemas.ReasonOf(err))
	case err != nil:
		return unavailable(err)
	}
	defer sub.Close()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	httpserve.Hold(w, r, 0) // and before each write: a stream, no write timeout
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, ": tollgate events\n\n")
	fl.Flush()
	// The next heartbeat is due Heartbeat after the last write, whatever
	// events keep filters out in between: a busy feed none of whose events
	// this stream wants must not starve it of heartbeats (nor of Hold).
	beat := time.Now().Add(s.cfg.Heartbeat)
	for {
		wait, cancel := context.WithDeadline(ctx, beat)
		m, err := sub.Next(wait)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, context.DeadlineExceeded):
			httpserve.Hold(w, r, 0)
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return nil
			}
			fl.Flush()
			beat = time.Now().Add(s.cfg.Heartbeat)
			continue
		case err != nil:
			s.cfg.Logger.Debug("gateway: event stream ended", "key", key.ID, "err", err)
			return nil
		}
		ev, ok := decodeEvent(m)
		if !ok || !keep(ev) {
			continue
		}
		data, err := json.Marshal(ev.payload)
		if err != nil {
			continue
		}
		httpserve.Hold(w, r, 0)
		if _, err := fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", ev.id, ev.kind, data); err != nil {
			return nil
		}
		fl.Flush()
		if last != nil && last(ev) {
			return nil
		}
		beat = time.Now().Add(s.cfg.Heartbeat)
	}
}

// decodeEvent reads a stored event; false for one that does not decode as
// a msgpack map.
func decodeEvent(m eventfeed.Event) (*event, bool) {
	var payload map[string]any
	if err := msgpack.Unmarshal(m.Data, &payload); err != nil {
		return nil, false
	}
	kind := strings.TrimPrefix(m.Subject, eventPrefix)
	if i := strings.LastIndexByte(kind, '.'); i > 0 {
		kind = kind[:i]
	}
	return &event{id: m.ID.String(), kind: kind, subject: m.Subject, payload: payload}, true
}

// turnOfEvent is the turn an event belongs to: the last token of its
// subject, for the events of a turn (docs/protocol.md §5: approval,
// batch, redrive and turn events); "" for the others (grants, decision
// rejections), which belong to no turn. It is the one rule of both event
// streams: a turn's stream has the events of that turn, a session's the
// events of its turns.
func turnOfEvent(subject string) string {
	rest, ok := strings.CutPrefix(subject, eventPrefix)
	if !ok || strings.HasPrefix(rest, "grant.") || strings.HasPrefix(rest, "decision.") {
		return ""
	}
	if i := strings.LastIndexByte(rest, '.'); i > 0 {
		return rest[i+1:]
	}
	return ""
}

// turnEvents streams the events of one turn of the key's transport, from
// its first (every event whose subject ends in the turn id:
// docs/protocol.md §5), and ends the response after the turn's outcome,
// its last event (a planner turn's reply comes before it).
func (s *Server) turnEvents(w http.ResponseWriter, r *http.Request, key *Key) error {
	id := r.PathValue("id")
	// A client may subscribe right after submitting: give ingest and the
	// executor the submit wait to create the batch.
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.SubmitWait)
	v, err := s.watchTurn(ctx, id, func(*TurnView) bool { return true })
	cancel()
	if v == nil && err != nil && ctx.Err() != nil {
		err = errUnknown
	}
	if _, err := ownTurn(v, err, key); err != nil {
		return err
	}
	return s.streamEvents(w, r, key, eventPrefix+"*.*."+id, true,
		func(ev *event) bool { return turnOfEvent(ev.subject) == id },
		func(ev *event) bool { return ev.kind == "turn.outcome" })
}

// sessionEvents streams new events (or those after Last-Event-ID) of the
// turns of one session (?session=, required) that belong to the key's
// transport: the events each of those turns' streams has (turnOfEvent).
// Events of no turn (grants, decision rejections) are not included.
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request, key *Key) error {
	session := r.URL.Query().Get("session")
	if session == "" {
		return errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "session is required: /v1/events?session=<session id>")
	}
	mine := map[string]bool{} // turn id -> of the key's transport
	return s.streamEvents(w, r, key, eventPrefix+">", false, func(ev *event) bool {
		turn := turnOfEvent(ev.subject)
		if turn == "" {
			return false
		}
		ok, seen := mine[turn]
		if !seen {
			b, _, err := s.store.Batches.Get(r.Context(), turn)
			if err != nil {
				return false // no batch (yet): asked again on the turn's next event
			}
			ok = b.SessionID == session && b.Context != nil && b.Context.Transport == key.Transport
			mine[turn] = ok
		}
		return ok
	}, nil)
}
