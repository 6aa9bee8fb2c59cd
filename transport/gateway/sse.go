package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/schemas"
)

// eventPrefix starts every subject of TOLLGATE_EVENTS.
const eventPrefix = "tollgate.event."

// event is one stored event as an SSE message: id is its stream sequence,
// kind the subject without prefix and last token (approval.requested,
// approval.decided, batch.awaiting, redrive.started, turn.outcome, ...),
// data the payload as JSON with the wire field names of docs/protocol.md §6.
type event struct {
	seq     uint64
	kind    string
	subject string
	payload map[string]any
}

// lastEventID reads Last-Event-ID (header, or ?last_event_id= for clients
// that cannot set headers): the stream sequence of the last event the
// client has; 0 when absent.
func lastEventID(r *http.Request) (uint64, error) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("last_event_id")
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "Last-Event-ID: want the id (a stream sequence) of an event")
	}
	return n, nil
}

// streamEvents serves Server-Sent Events from TOLLGATE_EVENTS: the
// messages on filter after Last-Event-ID (from the start of the stream
// when fromStart and no Last-Event-ID is given, else only new ones), those
// keep accepts, each with id = stream sequence, so a client that
// reconnects with Last-Event-ID misses nothing. A comment line is sent
// every Config.Heartbeat. It returns when the client goes away.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, filter string, fromStart bool, keep func(*event) bool) error {
	after, err := lastEventID(r)
	if err != nil {
		return err
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		return errors.New("gateway: streaming unsupported by the response writer")
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverNewPolicy}
	switch {
	case after > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	case fromStart:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	cons, err := s.events.OrderedConsumer(ctx, cfg)
	if err != nil {
		return unavailable(err)
	}
	msgs := make(chan jetstream.Msg, 64)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return unavailable(err)
	}
	// Unblock a delivery waiting on msgs before stopping the consumer.
	defer func() { cancel(); cc.Stop() }()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	httpserve.Hold(w, r, 0) // and before each write: a stream, no write timeout
	w.WriteHeader(http.StatusOK)
	_, _ = fmt.Fprint(w, ": tollgate events\n\n")
	fl.Flush()
	beat := time.NewTicker(s.cfg.Heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-beat.C:
			httpserve.Hold(w, r, 0)
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return nil
			}
			fl.Flush()
		case m := <-msgs:
			ev, ok := decodeEvent(m)
			if !ok || !keep(ev) {
				continue
			}
			data, err := json.Marshal(ev.payload)
			if err != nil {
				continue
			}
			httpserve.Hold(w, r, 0)
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.seq, ev.kind, data); err != nil {
				return nil
			}
			fl.Flush()
		}
	}
}

// decodeEvent reads a stored event; false for one that does not decode as
// a msgpack map.
func decodeEvent(m jetstream.Msg) (*event, bool) {
	meta, err := m.Metadata()
	if err != nil {
		return nil, false
	}
	var payload map[string]any
	if err := msgpack.Unmarshal(m.Data(), &payload); err != nil {
		return nil, false
	}
	kind := strings.TrimPrefix(m.Subject(), eventPrefix)
	if i := strings.LastIndexByte(kind, '.'); i > 0 {
		kind = kind[:i]
	}
	return &event{seq: meta.Sequence.Stream, kind: kind, subject: m.Subject(), payload: payload}, true
}

// turnEvents streams the events of one turn of the key's transport, from
// its first (every event whose subject ends in the turn id:
// docs/protocol.md §5).
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
	return s.streamEvents(w, r, eventPrefix+"*.*."+id, true, func(*event) bool { return true })
}

// sessionEvents streams new events (or those after Last-Event-ID) of one
// session (?session=, required) whose turns belong to the key's transport.
// Events without a session (redrive outcomes, decision rejections) are
// not included.
func (s *Server) sessionEvents(w http.ResponseWriter, r *http.Request, key *Key) error {
	session := r.URL.Query().Get("session")
	if session == "" {
		return errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "session is required: /v1/events?session=<session id>")
	}
	mine := map[string]bool{} // turn id -> of the key's transport
	return s.streamEvents(w, r, eventPrefix+">", false, func(ev *event) bool {
		if sid, _ := ev.payload["session_id"].(string); sid != session {
			return false
		}
		turn, _ := ev.payload["turn_id"].(string)
		ok, seen := mine[turn]
		if !seen {
			b, _, err := s.store.Batches.Get(r.Context(), turn)
			ok = err == nil && b.Context != nil && b.Context.Transport == key.Transport
			mine[turn] = ok
		}
		return ok
	})
}
