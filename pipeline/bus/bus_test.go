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

func started(turn string) (string, *schemas.RedriveOutcome) {
	return topology.EventSubject(topology.SubjectRedrive+"started.", turn),
		&schemas.RedriveOutcome{TurnID: turn, Kind: schemas.RedriveStarted, At: time.Now().UTC()}
}

func TestPendingWaitReportsWhetherTheMessageWasStored(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events, err := env.JS.Stream(ctx, topology.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a message its stream takes is stored, and asking again gives the same answer", func(t *testing.T) {
		subj, o := started("t-stored")
		p, err := bus.PublishAsync(ctx, env.JS, subj, "redrive:started:t-stored", o)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := p.Wait(ctx); err != nil {
				t.Fatalf("wait: %v", err)
			}
		}
		m, err := events.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatalf("the acknowledged message is not in %s: %v", topology.StreamEvents, err)
		}
		if got, err := schemas.Decode[schemas.RedriveOutcome](m.Data); err != nil || got.TurnID != "t-stored" {
			t.Fatalf("stored %+v %v", got, err)
		}
	})
	t.Run("a message no stream takes is an error", func(t *testing.T) {
		_, o := started("t-lost")
		p, err := bus.PublishAsync(ctx, env.JS, "nostream.t-lost", "", o)
		if err != nil {
			t.Fatal(err)
		}
		err = p.Wait(ctx)
		if !errors.Is(err, jetstream.ErrNoStreamResponse) {
			t.Fatalf("wait: %v, want ErrNoStreamResponse", err)
		}
		if again := p.Wait(ctx); again == nil || again.Error() != err.Error() {
			t.Fatalf("second wait: %v, want %v", again, err)
		}
	})
	t.Run("a record that does not encode is refused before sending", func(t *testing.T) {
		subj, o := started("t-bad")
		o.Kind = "maybe"
		if _, err := bus.PublishAsync(ctx, env.JS, subj, "", o); schemas.CodeOf(err) != schemas.CodeInvalidInput {
			t.Fatalf("publish: %v, want %s", err, schemas.CodeInvalidInput)
		}
		if _, err := events.GetLastMsgForSubject(ctx, subj); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatalf("something was stored: %v", err)
		}
	})
	t.Run("a wait cut short by its context can be waited for again", func(t *testing.T) {
		subj, o := started("t-later")
		p, err := bus.PublishAsync(ctx, env.JS, subj, "", o)
		if err != nil {
			t.Fatal(err)
		}
		done, stop := context.WithCancel(ctx)
		stop()
		// nil if the acknowledgement is already in (select picks at random
		// between ready cases), else the context's error, unsettled.
		if err := p.Wait(done); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("wait on a cancelled context: %v", err)
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatalf("second wait: %v", err)
		}
	})
	t.Run("a nil pending has nothing to wait for", func(t *testing.T) {
		var p *bus.Pending
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A message refused for its size can never be stored: PublishRaw and Wait
// give it CodePayloadTooLarge, so that schemas.Permanent tells it from a
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
	t.Run("the same refusal through PublishAsync", func(t *testing.T) {
		p, err := bus.PublishAsync(ctx, env.JS, "small.async", "", &schemas.RedriveOutcome{TurnID: "t-big", Kind: schemas.RedriveStarted, At: time.Now().UTC(), Reason: strings.Repeat("r", 2048)})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(ctx); schemas.CodeOf(err) != schemas.CodePayloadTooLarge {
			t.Fatalf("wait: %v, want %s", err, schemas.CodePayloadTooLarge)
		}
	})
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
