package submit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
	"github.com/tollgate-dev/tollgate/schemas"
)

// stored returns the decisions TOLLGATE_DECISIONS holds on approval id's
// cli subject (its last one), with their message ids, and that message's
// sequence.
func stored(t *testing.T, js jetstream.JetStream, id string) (ids []string, seq uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, topology.StreamDecisions)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, topology.DecisionSubject("cli", id))
	if err != nil {
		return nil, 0
	}
	d, err := schemas.Decode[schemas.Decision](m.Data)
	if err != nil || d.ApprovalID != id {
		t.Fatalf("stored decision on %s: %+v, %v", id, d, err)
	}
	return []string{m.Header.Get(jetstream.MsgIDHeader)}, m.Sequence
}

// TestTheAnswerDecidesWhetherTheDecisionIsStored runs Decision against a
// stand-in for the approver's service on a real server, scripted to give
// each answer the protocol defines (docs/protocol.md §9.2): an answer
// that says what the decision did leaves the stream alone; one that hands
// it back, one Decision does not know, and no answer at all store it on
// TOLLGATE_DECISIONS, message id its decision id, and say where
// (Answer.Stored). Sent again, a stored decision is the same message.
func TestTheAnswerDecidesWhetherTheDecisionIsStored(t *testing.T) {
	env := jstest.Start(t)
	tests := []struct {
		name   string
		answer nats.Header // nil: no responder
		want   submit.Answer
		stored bool
	}{
		{"applied", nats.Header{submit.HeaderResult: {"applied"}}, submit.Answer{Result: submit.Applied}, false},
		{"a vote", nats.Header{submit.HeaderResult: {"vote"}}, submit.Answer{Result: submit.Vote}, false},
		{"a repeat", nats.Header{submit.HeaderResult: {"idempotent"}}, submit.Answer{Result: submit.Idempotent}, false},
		{"a rejection with its code", nats.Header{micro.ErrorCodeHeader: {string(schemas.CodeApprovalExpired)}, micro.ErrorHeader: {"expired at noon"}},
			submit.Answer{Result: submit.Rejected, Code: schemas.CodeApprovalExpired, Reason: "expired at noon"}, false},
		{"handed back", nats.Header{micro.ErrorCodeHeader: {submit.NotTaken}, micro.ErrorHeader: {"not now"}}, submit.Answer{Result: submit.Queued}, true},
		{"an answer it does not know", nats.Header{submit.HeaderResult: {"maybe"}}, submit.Answer{Result: submit.Queued}, true},
		{"no approver", nil, submit.Answer{Result: submit.Queued}, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := schemas.ApprovalID(schemas.TurnID("cli", "m-"+string(rune('a'+i))), 0)
			if tt.answer != nil {
				sub, err := env.NC.Subscribe(topology.DecideSubject("cli", id), func(m *nats.Msg) {
					_ = m.RespondMsg(&nats.Msg{Header: tt.answer})
				})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = sub.Unsubscribe() }()
				if err := env.NC.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			d := &schemas.Decision{
				DecisionID: "d-submit-" + string(rune('a'+i)), ApprovalID: id, Transport: "cli",
				Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true},
				Option:  schemas.OptionApprove, SentAt: time.Now().UTC(),
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := submit.Decision(ctx, env.JS, d)
			ack := got.Stored
			got.Stored = nil
			if err != nil || got != tt.want {
				t.Fatalf("Decision = %+v, %v; want %+v", got, err, tt.want)
			}
			ids, seq := stored(t, env.JS, id)
			switch {
			case tt.stored && (len(ids) != 1 || ids[0] != d.DecisionID):
				t.Fatalf("stored %v, want the decision under message id %s", ids, d.DecisionID)
			case tt.stored && (ack == nil || ack.Stream != topology.StreamDecisions || ack.Sequence != seq || ack.Duplicate):
				t.Fatalf("Answer.Stored = %+v, want %s sequence %d, not a duplicate", ack, topology.StreamDecisions, seq)
			case !tt.stored && (len(ids) != 0 || ack != nil):
				t.Fatalf("stored %v (Answer.Stored %+v) for a decision the approver answered", ids, ack)
			}
			if !tt.stored {
				return
			}
			again, err := submit.Decision(ctx, env.JS, d)
			if err != nil || again.Result != submit.Queued || again.Stored == nil || !again.Stored.Duplicate || again.Stored.Sequence != seq {
				t.Fatalf("sent again: Decision = %+v (Stored %+v), %v; want queued, a duplicate of sequence %d", again, again.Stored, err, seq)
			}
		})
	}
}

// A caller's context that ends first is an error, and nothing is stored:
// the decision did not reach Tollgate, and its sender may send it again.
func TestACallerWhoGivesUpStoresNothing(t *testing.T) {
	env := jstest.Start(t)
	id := schemas.ApprovalID(schemas.TurnID("cli", "m-slow"), 0)
	sub, err := env.NC.Subscribe(topology.DecideSubject("cli", id), func(*nats.Msg) {}) // hears it, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	d := &schemas.Decision{DecisionID: "d-slow", ApprovalID: id, Transport: "cli",
		Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true}, Option: schemas.OptionApprove, SentAt: time.Now().UTC()}
	if a, err := submit.Decision(ctx, env.JS, d); err == nil {
		t.Fatalf("Decision = %+v with the caller's context ended, want an error", a)
	}
	if ids, _ := stored(t, env.JS, id); len(ids) != 0 {
		t.Fatalf("stored %v after the caller gave up", ids)
	}
}

// dropStores makes TOLLGATE_DECISIONS stop answering publishes on approval
// id's cli subject, as a stream leader losing its leadership drops one
// (jstest.Unanswered).
func dropStores(t *testing.T, env *jstest.Env, id string) (heard <-chan *nats.Msg, restore func()) {
	t.Helper()
	return jstest.Unanswered(t, env, topology.StreamDecisions, topology.DecisionSubject("cli", id))
}

// A store that gets no answer at all is made again under the same message
// id (each attempt is bounded), not waited on until the caller's deadline:
// on a cluster a publish that meets a leader change can be dropped so,
// and the decision was lost with it (cluster-test seed 704350681).
func TestAStoreThatGetsNoAnswerIsMadeAgain(t *testing.T) {
	submit.SetStoreAttemptTimeout(t, 300*time.Millisecond)
	env := jstest.Start(t)
	id := schemas.ApprovalID(schemas.TurnID("cli", "m-dropped"), 0)
	heard, restore := dropStores(t, env, id)
	go func() {
		<-heard // the first attempt, dropped: the stream takes the next
		restore()
	}()
	d := &schemas.Decision{DecisionID: "d-dropped", ApprovalID: id, Transport: "cli",
		Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true}, Option: schemas.OptionApprove, SentAt: time.Now().UTC()}
	ctx, cancel := context.WithTimeout(context.Background(), jstest.Scale(jstest.Wait))
	defer cancel()
	a, err := submit.Decision(ctx, env.JS, d)
	if err != nil || a.Result != submit.Queued || a.Stored == nil {
		t.Fatalf("Decision = %+v, %v; want it queued once the stream answers", a, err)
	}
	ids, seq := stored(t, env.JS, id)
	if len(ids) != 1 || ids[0] != d.DecisionID || a.Stored.Sequence != seq {
		t.Fatalf("stored %v at %d (Answer.Stored %+v), want %s once", ids, seq, a.Stored, d.DecisionID)
	}
}

// When the stream never answers, the attempts go on until the caller's
// context ends, and the error says so: the decision did not reach
// Tollgate, and its sender may send it again.
func TestAStoreTheStreamNeverAnswersFailsWhenTheCallerGivesUp(t *testing.T) {
	submit.SetStoreAttemptTimeout(t, 200*time.Millisecond)
	env := jstest.Start(t)
	id := schemas.ApprovalID(schemas.TurnID("cli", "m-never"), 0)
	heard, restore := dropStores(t, env, id)
	d := &schemas.Decision{DecisionID: "d-never", ApprovalID: id, Transport: "cli",
		Decider: schemas.Sender{ID: "alice", Kind: schemas.SenderUser, Verified: true}, Option: schemas.OptionApprove, SentAt: time.Now().UTC()}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	a, err := submit.Decision(ctx, env.JS, d)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Decision = %+v, %v; want the caller's deadline", a, err)
	}
	restore()
	if n := len(heard); n < 2 {
		t.Fatalf("the stream was tried %d times before the caller gave up, want more than once", n)
	}
	if ids, _ := stored(t, env.JS, id); len(ids) != 0 {
		t.Fatalf("stored %v", ids)
	}
}
