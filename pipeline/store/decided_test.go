package store_test

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

func decidedApproval(turn string, status schemas.ApprovalStatus) *schemas.ApprovalRecord {
	a := approval(turn)
	a.Status = status
	a.Decision = &schemas.DecisionInfo{DecisionID: "d-1", Principal: "slack:U2", Option: schemas.OptionApprove, DecidedAt: now.Add(time.Minute)}
	return a
}

func encoded(t *testing.T, v schemas.Record) []byte {
	t.Helper()
	b, err := schemas.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A revision of the approvals bucket is a decision's event exactly when it
// holds a decided record as written: a pending record, a delete or purge
// marker and a retire rewrite stand for none; a revision that does not
// decode, or that holds another approval than its subject names, is an
// error with a code, never a decision.
func TestDecidedOfTellsADecisionFromEveryOtherRevision(t *testing.T) {
	turn := "t-00000000000000000042"
	id := schemas.ApprovalID(turn, 0)
	subject := topology.ApprovalRevisionSubject(id)
	hdr := func(k, v string) nats.Header { h := nats.Header{}; h.Set(k, v); return h }
	for _, tc := range []struct {
		name     string
		subject  string
		header   nats.Header
		data     []byte
		decision bool
		code     schemas.Code
	}{
		{name: "a pending record is no decision", subject: subject, data: encoded(t, approval(turn))},
		{name: "an approved record is its decision", subject: subject, data: encoded(t, decidedApproval(turn, schemas.ApprovalApproved)), decision: true},
		{name: "a denied record is its decision", subject: subject, data: encoded(t, decidedApproval(turn, schemas.ApprovalDenied)), decision: true},
		{name: "an expired record is its decision", subject: subject, data: encoded(t, decidedApproval(turn, schemas.ApprovalExpired)), decision: true},
		{name: "an abandoned record is its decision", subject: subject, data: encoded(t, decidedApproval(turn, schemas.ApprovalAbandoned)), decision: true},
		{name: "a decided record with a TTL is its decision", subject: subject, header: hdr(jetstream.MsgTTLHeader, "720h0m0s"), data: encoded(t, decidedApproval(turn, schemas.ApprovalApproved)), decision: true},
		{name: "a retire rewrite repeats a decision", subject: subject, header: hdr(store.RewriteHeader, store.RewriteRetire), data: encoded(t, decidedApproval(turn, schemas.ApprovalApproved))},
		{name: "a delete marker is no decision", subject: subject, header: hdr("KV-Operation", "DEL")},
		{name: "a purge marker is no decision", subject: subject, header: hdr("KV-Operation", "PURGE")},
		{name: "bytes that do not decode are refused", subject: subject, data: []byte("not msgpack"), code: schemas.CodeMalformed},
		{name: "another approval's record is refused", subject: topology.ApprovalRevisionSubject(schemas.ApprovalID(turn, 1)), data: encoded(t, decidedApproval(turn, schemas.ApprovalApproved)), code: schemas.CodeMalformed},
		{name: "a subject outside the bucket is refused", subject: "tollgate.event.approval.decided." + turn, data: encoded(t, decidedApproval(turn, schemas.ApprovalApproved)), code: schemas.CodeMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := store.DecidedOf(tc.subject, tc.header, tc.data)
			if tc.code != "" {
				if schemas.CodeOf(err) != tc.code || ev != nil {
					t.Fatalf("DecidedOf = %+v, %v; want code %s", ev, err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.decision {
				if ev != nil {
					t.Fatalf("DecidedOf = %+v; want no decision", ev)
				}
				return
			}
			rec, err := schemas.Decode[schemas.ApprovalRecord](tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if ev == nil || ev.ApprovalID != id || ev.TurnID != turn || ev.Status != rec.Status || ev.Repeat != "" ||
				ev.Decision == nil || ev.Decision.DecisionID != "d-1" || !ev.At.Equal(rec.Decision.DecidedAt) {
				t.Fatalf("DecidedOf = %+v; want the decision of %s as recorded", ev, id)
			}
			if got, want := encoded(t, ev), encoded(t, schemas.DecidedOf(rec)); !bytes.Equal(got, want) {
				t.Fatal("the projection differs from schemas.DecidedOf of the record")
			}
		})
	}
}

// Read from a real bucket's stream, an approval's life (created pending, a
// vote, decided, retired with its TTL by a store that retains) holds
// exactly one decision: the revision that decided it. The retire rewrite
// is a later message of the same key (the bucket keeps one revision per
// key, so it replaced the decision's), and it stands for none.
func TestTheBucketsStreamHoldsEachDecisionOnce(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	turn := "t-00000000000000000043"
	id := schemas.ApprovalID(turn, 0)

	// Decided by a store that does not retain (an earlier deployment),
	// then retired by one that does: the case where a rewrite is written.
	plain := store.New(env.Buckets)
	rev, err := plain.Approvals.Create(ctx, id, approval(turn))
	if err != nil {
		t.Fatal(err)
	}
	voted := approval(turn)
	voted.Votes = []schemas.DecisionInfo{{DecisionID: "d-0", Principal: "slack:U3", Option: schemas.OptionApprove, DecidedAt: now}}
	if rev, err = plain.Approvals.Update(ctx, id, voted, rev); err != nil {
		t.Fatal(err)
	}
	decided := decidedApproval(turn, schemas.ApprovalApproved)
	decided.Votes = voted.Votes
	if rev, err = plain.Approvals.Update(ctx, id, decided, rev); err != nil {
		t.Fatal(err)
	}
	live := func() []*schemas.DecidedEvent {
		t.Helper()
		c, err := env.JS.OrderedConsumer(ctx, topology.StreamApprovals, jetstream.OrderedConsumerConfig{FilterSubjects: []string{topology.ApprovalRevisions}})
		if err != nil {
			t.Fatal(err)
		}
		var out []*schemas.DecidedEvent
		for {
			m, err := c.Next(jetstream.FetchMaxWait(500 * time.Millisecond))
			if err != nil {
				return out
			}
			ev, err := store.DecidedOf(m.Subject(), m.Headers(), m.Data())
			if err != nil {
				t.Fatal(err)
			}
			if ev != nil {
				out = append(out, ev)
			}
		}
	}
	if got := live(); len(got) != 1 || got[0].ApprovalID != id || len(got[0].Votes) != 1 {
		t.Fatalf("decisions in the stream after the decision: %+v; want the one, with its vote", got)
	}
	retained := store.New(env.Buckets)
	retained.Retain(env.JS, time.Hour)
	if err := retained.Approvals.Retire(ctx, id); err != nil {
		t.Fatal(err)
	}
	m, err := env.JS.Stream(ctx, topology.StreamApprovals)
	if err != nil {
		t.Fatal(err)
	}
	last, err := m.GetLastMsgForSubject(ctx, topology.ApprovalRevisionSubject(id))
	if err != nil {
		t.Fatal(err)
	}
	if last.Sequence <= rev || last.Header.Get(store.RewriteHeader) != store.RewriteRetire || last.Header.Get(jetstream.MsgTTLHeader) == "" {
		t.Fatalf("after Retire the key's message is seq %d (decided at %d), headers %v; want a marked rewrite with a TTL", last.Sequence, rev, last.Header)
	}
	if got := live(); len(got) != 0 {
		t.Fatalf("decisions in the stream after the retire: %+v; want none (the rewrite repeats the decision it replaced)", got)
	}
}

// DecidedOf never panics, and a decision it finds names the approval of
// its subject and a decided status.
func FuzzDecidedOf(f *testing.F) {
	turn := "t-00000000000000000044"
	f.Add(schemas.ApprovalID(turn, 0), "", encodedF(f, decidedApproval(turn, schemas.ApprovalApproved)))
	f.Add(schemas.ApprovalID(turn, 0), store.RewriteRetire, encodedF(f, decidedApproval(turn, schemas.ApprovalDenied)))
	f.Add(schemas.ApprovalID(turn, 1), "", encodedF(f, approval(turn)))
	f.Add("x", "", []byte{0x80})
	f.Fuzz(func(t *testing.T, id, rewrite string, data []byte) {
		h := nats.Header{}
		if rewrite != "" {
			h.Set(store.RewriteHeader, rewrite)
		}
		ev, err := store.DecidedOf(topology.ApprovalRevisionSubject(id), h, data)
		if err != nil && schemas.CodeOf(err) == "" {
			t.Fatalf("an error without a code: %v", err)
		}
		if ev != nil && (ev.ApprovalID != id || !ev.Status.Decided() || err != nil) {
			t.Fatalf("DecidedOf = %+v, %v for approval %q", ev, err, id)
		}
	})
}

func encodedF(f *testing.F, v schemas.Record) []byte {
	f.Helper()
	b, err := schemas.Encode(v)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// A version 1 record (an earlier version's, decided or not) stands for no
// decision: that version published its decided event, and this one
// restores such a record to the current version before it writes it. A
// reader following the bucket passes it over instead of dead-lettering
// it.
func TestAVersion1RecordIsNoDecision(t *testing.T) {
	data, err := os.ReadFile("../../schemas/testdata/approval_record.v1.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	_, v1, err := schemas.DecodeApproval(data)
	if err != nil || v1 == nil {
		t.Fatalf("the golden v1 record decodes as %+v, %v", v1, err)
	}
	ev, err := store.DecidedOf(topology.ApprovalRevisionSubject(v1.ApprovalID), nil, data)
	if err != nil || ev != nil {
		t.Fatalf("DecidedOf(v1) = %+v, %v; want no decision and no error", ev, err)
	}
}

// DecodeDecided never panics; what it returns are decided events of the
// turn's own approvals, and its errors carry a code.
func FuzzDecodeDecided(f *testing.F) {
	turn := "t-00000000000000000045"
	started := &schemas.BatchRecord{V: 2, TurnID: turn, State: schemas.BatchStarted,
		Calls: []schemas.ToolCall{{CallID: schemas.CallID(turn, 0)}}, Approvals: []string{schemas.ApprovalID(turn, 0)}, Results: []*schemas.ToolResult{nil},
		Decided: []*schemas.DecidedEvent{schemas.DecidedOf(decidedApproval(turn, schemas.ApprovalApproved))}}
	if got, err := store.DecodeDecided(turn, encodedF(f, started)); err != nil || len(got) != 1 || got[0].ApprovalID != schemas.ApprovalID(turn, 0) {
		f.Fatalf("the started event's decisions: %+v, %v; want its one decision", got, err)
	}
	if _, err := store.DecodeDecided("t-00000000000000000046", encodedF(f, started)); schemas.CodeOf(err) != schemas.CodeInvalidInput {
		f.Fatalf("another turn's started event: %v, want %s", err, schemas.CodeInvalidInput)
	}
	f.Add(turn, encodedF(f, started))
	f.Add("t-00000000000000000046", encodedF(f, started))
	f.Add(turn, []byte{0x80})
	f.Fuzz(func(t *testing.T, turn string, data []byte) {
		got, err := store.DecodeDecided(turn, data)
		if err != nil && schemas.CodeOf(err) == "" {
			t.Fatalf("an error without a code: %v", err)
		}
		for _, d := range got {
			if d == nil || d.TurnID != turn || !d.Status.Decided() {
				t.Fatalf("DecodeDecided(%q) = %+v", turn, d)
			}
		}
	})
}
