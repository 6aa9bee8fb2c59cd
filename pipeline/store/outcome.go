package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// ErrNoOutcome: an outcome event whose record holds no outcome. An
// earlier version's planner ended its loop turns so (the turn's outcome
// was only published); a reader passes such an event over, and the
// turn's published outcome is the one read (docs/protocol.md §4.2a,
// "Following outcomes").
var ErrNoOutcome = errors.New("the outcome event holds no outcome")

// DecodeOutcome returns the outcome of turn that the record of its
// outcome event (data) carries: an error with a code when data does not
// decode or is another turn's, ErrNoOutcome when it holds no outcome.
func DecodeOutcome(turn string, data []byte) (*schemas.TurnOutcome, error) {
	b, err := schemas.DecodeBatch(data)
	switch {
	case err != nil:
		return nil, err
	case b.TurnID != turn:
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "the outcome event of turn %s holds turn %s's batch", turn, b.TurnID)
	case b.Outcome == nil:
		return nil, fmt.Errorf("turn %s: %w", turn, ErrNoOutcome)
	}
	return b.Outcome, nil
}

// DecodeRequested returns the approvals that the record of turn's
// awaiting event (data) requested, each the record its approval-requested
// event announces (schemas.BatchRecord.RequestedApprovals): an error with
// a code when data does not decode or is another turn's; none when the
// event requested none (an earlier version published its requests, or
// the move to awaiting was made again after one that requested them).
func DecodeRequested(turn string, data []byte) ([]*schemas.ApprovalRecord, error) {
	b, err := eventBatch(turn, EventAwaiting, data)
	if err != nil {
		return nil, err
	}
	return b.RequestedApprovals(), nil
}

// DecodeDecided returns the decisions turn's started event (its data)
// passed its barrier on (schemas.BatchRecord.Decided), each naming one of
// the batch's approvals; an error with a code when it does not decode,
// holds another turn's batch or a decision of none of its approvals.
func DecodeDecided(turn string, data []byte) ([]*schemas.DecidedEvent, error) {
	b, err := eventBatch(turn, topology.EventTurnStarted, data)
	if err != nil {
		return nil, err
	}
	for _, d := range b.Decided {
		if d == nil || d.TurnID != turn || !slices.Contains(b.Approvals, d.ApprovalID) || !d.Status.Decided() {
			return nil, schemas.Errorf(schemas.CodeInvalidInput, "the started event of turn %s holds a decision that is not one of its approvals'", turn)
		}
	}
	return b.Decided, nil
}

// eventBatch decodes the batch record of turn's event (named event) from
// data; an error with a code when it does not decode or is another
// turn's.
func eventBatch(turn, event string, data []byte) (*schemas.BatchRecord, error) {
	b, err := schemas.DecodeBatch(data)
	switch {
	case err != nil:
		return nil, err
	case b.TurnID != turn:
		return nil, schemas.Errorf(schemas.CodeInvalidInput, "the %s event of turn %s holds turn %s's batch", event, turn, b.TurnID)
	}
	return b, nil
}

// LoggedRequest reports whether turn's log, in its partition of logs (the
// turn-log streams, topology.OpenTurnLogs), keeps the request of approval
// id, and the sequence of the awaiting event that keeps it. A batch moves
// to awaiting once, and that event keeps its requests; a write made while
// it waits is another awaiting event, which keeps none. So the turn's
// last awaiting event is read first (one direct get by subject), and only
// when it keeps none, the earlier ones, oldest first. An event that does
// not decode keeps none. Its error is a read's.
func LoggedRequest(ctx context.Context, logs []jetstream.Stream, turn, id string) (uint64, bool, error) {
	if len(logs) == 0 || !schemas.ValidKey(turn) {
		return 0, false, nil
	}
	p := topology.TurnLogPartition(turn, len(logs))
	subject := topology.TurnLogSubject(p, turn, EventAwaiting)
	m, err := logs[p].GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read the awaiting event of %s: %w", turn, err)
	}
	if reqs, err := DecodeRequested(turn, m.Data); err == nil && len(reqs) > 0 {
		return m.Sequence, keeps(reqs, id), nil
	}
	last := m.Sequence
	for from := uint64(1); from < last; {
		m, err := logs[p].GetMsg(ctx, from, jetstream.WithGetMsgSubject(subject))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return 0, false, nil
		case err != nil:
			return 0, false, fmt.Errorf("read the awaiting events of %s: %w", turn, err)
		case m.Sequence >= last:
			return 0, false, nil
		}
		if reqs, err := DecodeRequested(turn, m.Data); err == nil && len(reqs) > 0 {
			return m.Sequence, keeps(reqs, id), nil // the move: the one event that requests
		}
		from = m.Sequence + 1
	}
	return 0, false, nil
}

// keeps reports whether reqs hold approval id's request.
func keeps(reqs []*schemas.ApprovalRecord, id string) bool {
	return slices.ContainsFunc(reqs, func(a *schemas.ApprovalRecord) bool { return a.ApprovalID == id })
}

// LoggedOutcome reads turn's outcome event in its partition of logs (the
// turn-log streams, topology.OpenTurnLogs) and reports its sequence and
// whether it keeps the turn's outcome: false for a turn whose log holds
// no outcome event, or one without the outcome (ErrNoOutcome). Its error
// is the read's.
func LoggedOutcome(ctx context.Context, logs []jetstream.Stream, turn string) (uint64, bool, error) {
	if len(logs) == 0 || !schemas.ValidKey(turn) {
		return 0, false, nil
	}
	p := topology.TurnLogPartition(turn, len(logs))
	m, err := logs[p].GetLastMsgForSubject(ctx, topology.TurnLogSubject(p, turn, EventOutcome))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read the outcome event of %s: %w", turn, err)
	}
	_, err = DecodeOutcome(turn, m.Data)
	return m.Sequence, err == nil, nil
}
