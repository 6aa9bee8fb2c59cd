package bus_test

import (
	"context"
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
