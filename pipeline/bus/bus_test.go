package bus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

// A message refused for its size can never be stored: PublishRaw gives
// it CodePayloadTooLarge, so that schemas.Permanent tells it from a
// failure a retry may cure.
func TestASizeRefusalIsPermanent(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 1024}); err != nil {
		t.Fatal(err)
	}
	bigHeaders := nats.Header{}
	for i := range 17 {
		bigHeaders.Set(fmt.Sprintf("X-Pad-%02d", i), strings.Repeat("h", 4000))
	}
	cases := []struct {
		name      string
		subject   string
		data      []byte
		hdr       nats.Header
		permanent bool
	}{
		{"a header block over 64 KiB", "small.hdr", []byte("x"), bigHeaders, true},
		{"a body over the stream's message size limit", "small.body", make([]byte, 2048), nil, true},
		{"a body over the connection's max payload", "small.payload", make([]byte, env.NC.MaxPayload()+1), nil, true},
		{"no stream for the subject", "nostream.x", []byte("x"), nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := bus.PublishRaw(ctx, env.JS, tc.subject, "", tc.data, tc.hdr)
			if err == nil {
				t.Fatal("published")
			}
			if got := schemas.Permanent(err); got != tc.permanent {
				t.Fatalf("Permanent(%v) = %v, want %v", err, got, tc.permanent)
			}
			if tc.permanent && schemas.CodeOf(err) != schemas.CodePayloadTooLarge {
				t.Fatalf("code %q (%v), want %s", schemas.CodeOf(err), err, schemas.CodePayloadTooLarge)
			}
		})
	}
}

// TestStored: false before anything is on the subject (another subject's
// message does not count), true after, and an error, not false, when the
// lookup itself fails (the stream is gone).
func TestStored(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	s, err := env.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	subj := topology.EventSubject(topology.SubjectTurnOutcome, "t-stored")
	other := topology.EventSubject(topology.SubjectTurnOutcome, "t-other")
	if err := bus.PublishRaw(ctx, env.JS, other, "", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if stored, err := bus.Stored(ctx, s, subj); err != nil || stored {
		t.Fatalf("before: stored %v, err %v; want false, nil", stored, err)
	}
	if err := bus.PublishRaw(ctx, env.JS, subj, "", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if stored, err := bus.Stored(ctx, s, subj); err != nil || !stored {
		t.Fatalf("after: stored %v, err %v; want true, nil", stored, err)
	}
	if err := env.JS.DeleteStream(ctx, topology.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if stored, err := bus.Stored(ctx, s, subj); err == nil || stored {
		t.Fatalf("stream gone: stored %v, err %v; want an error", stored, err)
	}
}

// deafStream makes a stream of its own, DEAF, that does not answer
// publishes on subject until take (jstest.Unanswered).
func deafStream(t *testing.T, env *jstest.Env, subject string) (heard <-chan *nats.Msg, take func()) {
	t.Helper()
	if _, err := env.JS.CreateStream(jstest.Ctx(t), jetstream.StreamConfig{Name: "DEAF", Subjects: []string{"deaf.>"}}); err != nil {
		t.Fatal(err)
	}
	return jstest.Unanswered(t, env, "DEAF", subject)
}

// count is the messages stream DEAF holds on subject.
func count(t *testing.T, env *jstest.Env, subject string) uint64 {
	t.Helper()
	s, err := env.JS.Stream(jstest.Ctx(t), "DEAF")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(jstest.Ctx(t), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// A publish that gets no answer is made again under the same message id,
// each attempt bounded, and the message is stored once: the caller is
// not left waiting for an answer that never comes until its deadline.
func TestStoreMakesAnUnansweredAttemptAgain(t *testing.T) {
	env := jstest.Start(t)
	const subject = "deaf.x"
	heard, take := deafStream(t, env, subject)
	go func() {
		<-heard // the first attempt: unanswered; the stream takes the next
		take()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), jstest.Scale(jstest.Wait))
	defer cancel()
	ack, err := bus.Store(ctx, env.JS, subject, "m-1", []byte("x"), nil, bus.WithAttemptTimeout(300*time.Millisecond))
	if err != nil || ack.Stream != "DEAF" || ack.Duplicate {
		t.Fatalf("Store = %+v, %v; want it stored once the stream answers", ack, err)
	}
	if n := count(t, env, subject); n != 1 {
		t.Fatalf("%d messages stored, want 1", n)
	}
	// The same message id again, within the duplicate window: the copy
	// stored first.
	again, err := bus.Store(ctx, env.JS, subject, "m-1", []byte("x"), nil)
	if err != nil || !again.Duplicate || again.Sequence != ack.Sequence {
		t.Fatalf("Store again = %+v, %v; want the duplicate of sequence %d", again, err, ack.Sequence)
	}
}

// When no attempt is ever answered, Store tries until the caller's
// context ends, more than once, and its error says it was the deadline.
func TestStoreGivesUpWhenTheCallerDoes(t *testing.T) {
	env := jstest.Start(t)
	const subject = "deaf.y"
	heard, take := deafStream(t, env, subject)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	ack, err := bus.Store(ctx, env.JS, subject, "m-2", []byte("x"), nil, bus.WithAttemptTimeout(200*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Store = %+v, %v; want the caller's deadline", ack, err)
	}
	take()
	if n := len(heard); n < 2 {
		t.Fatalf("%d attempts before the caller gave up, want more than one", n)
	}
	if n := count(t, env, subject); n != 0 {
		t.Fatalf("%d messages stored, want none", n)
	}
}

// A refusal for good is returned at once, after one attempt: a
// compare-and-set's (the subject's last sequence is not the one
// expected), a message without a message id (an attempt made again could
// be stored twice), and a message over the stream's size limit (coded
// CodePayloadTooLarge).
func TestStoreDoesNotRetryARefusalForGood(t *testing.T) {
	env := jstest.Start(t)
	ctx := jstest.Ctx(t)
	if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "DEAF", Subjects: []string{"deaf.>"}, MaxMsgSize: 1024}); err != nil {
		t.Fatal(err)
	}
	stale := nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"7"}}
	for _, tc := range []struct {
		name  string
		msgID string
		data  []byte
		hdr   nats.Header
		check func(error) bool
	}{
		{"a compare-and-set on a stale sequence", "m-cas", []byte("x"), stale, bus.WrongLast},
		{"no message id", "", []byte("x"), nil, func(err error) bool { return err != nil }},
		{"over the stream's size limit", "m-big", make([]byte, 2048), nil, schemas.Permanent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			ack, err := bus.Store(ctx, env.JS, "deaf.z", tc.msgID, tc.data, tc.hdr)
			if err == nil || !tc.check(err) {
				t.Fatalf("Store = %+v, %v; want a refusal for good", ack, err)
			}
			if d := time.Since(start); d >= jstest.Scale(time.Second) {
				t.Fatalf("refused after %v: made again", d)
			}
		})
	}
	if n := count(t, env, "deaf.z"); n != 0 {
		t.Fatalf("%d messages stored, want none", n)
	}
}
