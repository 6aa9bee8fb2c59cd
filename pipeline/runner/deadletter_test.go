package runner_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/runner"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The dead-letter path: a dead letter always fits the dead-letter stream,
// and no message is retried forever when its dead letter cannot be
// completed.

// padHeaders returns n headers X-Pad-00... of value size bytes each.
func padHeaders(n, size int) nats.Header {
	h := nats.Header{}
	for i := range n {
		h.Set(fmt.Sprintf("X-Pad-%02d", i), strings.Repeat(string(rune('a'+i%26)), size))
	}
	return h
}

// wireHeaderBytes is the size of h, plus a Nats-Msg-Id of msgID, as a NATS
// header block: what JetStream limits to 64 KiB.
func wireHeaderBytes(h nats.Header, msgID string) int {
	n := len("NATS/1.0\r\n\r\n")
	if msgID != "" {
		n += len(jetstream.MsgIDHeader) + len(": \r\n") + len(msgID)
	}
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": \r\n") + len(v)
		}
	}
	return n
}

// A malformed message whose headers nearly fill JetStream's 64 KiB header
// limit leaves no room for the dead-letter headers. Its dead letter must
// still land, once, with the original body and as many of its headers as
// fit, marked as cut; and the message must be terminated, not retried.
func TestDeadLetterOfAMessageWithLargeHeaders(t *testing.T) {
	h := newHarness(t, "bighdr")
	h.cfg.BaseDelay = 10 * time.Millisecond
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		if string(m.Data()) == "ok" {
			return nil
		}
		return schemas.Errorf(schemas.CodeMalformed, "not msgpack")
	})
	// 16 headers of 4073 bytes and a trace id: a 65,394-byte header block,
	// which the server takes (at most 65,535) and which cannot also hold
	// the dead-letter headers.
	hdr := padHeaders(16, 4073)
	hdr.Set("X-Trace-Id", "trace-64")
	if n := wireHeaderBytes(hdr, ""); n > math.MaxUint16 || n+300 <= math.MaxUint16 {
		t.Fatalf("test setup: a %d-byte header block", n)
	}
	body := []byte{0xc1, 'b', 'a', 'd'}
	subj := subject("s-1")
	seq := h.publish(subj, body, hdr)

	dl := h.waitDeadLetters(1)[0]
	if !bytes.Equal(dl.Data, body) || dl.Header.Get(runner.HeaderTruncated) != "" {
		t.Errorf("dead letter body %x (truncated %q), want the original %x whole", dl.Data, dl.Header.Get(runner.HeaderTruncated), body)
	}
	if got := dl.Header.Get(runner.HeaderCode); got != string(schemas.CodeMalformed) {
		t.Errorf("code %q, want %s", got, schemas.CodeMalformed)
	}
	if got := dl.Header.Get(runner.HeaderOriginalSeq); got != strconv.FormatUint(seq, 10) {
		t.Errorf("original seq %q, want %d", got, seq)
	}
	var keys, size int
	if _, err := fmt.Sscanf(dl.Header.Get(runner.HeaderHeadersTruncated), "%d keys, %d bytes", &keys, &size); err != nil || keys < 1 || size < 4073*keys {
		t.Errorf("%s = %q, want the number and size of the headers left out", runner.HeaderHeadersTruncated, dl.Header.Get(runner.HeaderHeadersTruncated))
	}
	kept := 0
	for k := range hdr {
		if strings.HasPrefix(k, "X-Pad-") && dl.Header.Get(k) == hdr.Get(k) {
			kept++
		}
	}
	if kept+keys != 16 || dl.Header.Get("X-Trace-Id") != "trace-64" {
		t.Errorf("kept %d pad headers whole and left out %d, of 16; trace id %q", kept, keys, dl.Header.Get("X-Trace-Id"))
	}
	h.waitMetric(mDeadLettered, 1, string(schemas.CodeMalformed))

	// Terminated, not redelivered: once a later message of the same key
	// (handled after it) is acked, the big one has been handled once and
	// dead-lettered once.
	next := h.publish(subj, []byte("ok"), nil)
	h.waitSettled(next)
	if got := seen.get(string(body)); got != 1 {
		t.Errorf("the message was handled %d times, want 1", got)
	}
	if dls := h.deadLetters(); len(dls) != 1 {
		t.Errorf("%d dead letters, want 1", len(dls))
	}
	if got := h.metric(mRetried); got != 0 {
		t.Errorf("retried = %v, want 0", got)
	}
}

// A dead letter that cannot be stored (no dead-letter stream) is retried
// with a growing delay, but only until the message has been delivered
// DeadLetterTries times; then the message is given up: terminated, with an
// error in the log, never dead-lettered.
func TestADeadLetterThatCannotBeStoredIsGivenUpAfterTheLastTry(t *testing.T) {
	h := newHarness(t, "giveup")
	h.cfg.BaseDelay = 10 * time.Millisecond
	h.cfg.DeadLetterTries = 4
	if err := h.env.JS.DeleteStream(h.ctx, topology.StreamDLQ); err != nil {
		t.Fatal(err)
	}
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		if string(m.Data()) == "ok" {
			return nil
		}
		return schemas.Errorf(schemas.CodeUnknownMessage, "unknown")
	})
	subj := subject("s-1")
	seq := h.publish(subj, []byte("orphan"), nil)
	h.waitSettled(seq)

	next := h.publish(subj, []byte("ok"), nil)
	h.waitSettled(next)
	if got := seen.seenDeliveries("orphan"); fmt.Sprint(got) != "[1 2 3 4]" {
		t.Errorf("handler saw deliveries %v, want exactly [1 2 3 4]", got)
	}
	if got := h.metric(mRetried); got != 3 {
		t.Errorf("retried = %v, want 3", got)
	}
	if got := h.metric(mDeadLettered, string(schemas.CodeUnknownMessage)); got != 0 {
		t.Errorf("dead_lettered = %v without a dead-letter stream", got)
	}
	if log := h.log.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "giving the message up") {
		t.Errorf("no error logged for the message given up:\n%s", log)
	}
}

// A dead letter the stream refuses for good (here: larger than the
// stream's message size limit, lowered by hand) cannot be stored by any
// retry: the message is given up at once.
func TestADeadLetterTheStreamRefusesIsGivenUpAtOnce(t *testing.T) {
	h := newHarness(t, "refused")
	h.cfg.BaseDelay = 10 * time.Millisecond
	s, err := h.env.JS.Stream(h.ctx, topology.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgSize = 512
	if _, err := h.env.JS.UpdateStream(h.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	seen := newCounter()
	h.run(func(_ context.Context, m jetstream.Msg) error {
		seen.see(m)
		if string(m.Data()) == "ok" {
			return nil
		}
		return schemas.Errorf(schemas.CodeMalformed, "bad")
	})
	subj := subject("s-1")
	big := bytes.Repeat([]byte("x"), 1024)
	seq := h.publish(subj, big, nil)
	h.waitSettled(seq)

	next := h.publish(subj, []byte("ok"), nil)
	h.waitSettled(next)
	if got := seen.seenDeliveries(string(big)); fmt.Sprint(got) != "[1]" {
		t.Errorf("handler saw deliveries %v, want [1]", got)
	}
	if dl := h.deadLetters(); len(dl) != 0 {
		t.Errorf("%d dead letters stored over the stream's limit", len(dl))
	}
	if !strings.Contains(h.log.String(), "giving the message up") {
		t.Errorf("no error logged for the message given up:\n%s", h.log.String())
	}
}

// An OnDeadLetter hook that keeps failing holds the dead letter back only
// until the last try; then the message is dead-lettered anyway.
func TestAFailingDeadLetterHookHoldsTheDeadLetterBackUntilTheLastTry(t *testing.T) {
	h := newHarness(t, "hook")
	h.cfg.BaseDelay = 10 * time.Millisecond
	h.cfg.DeadLetterTries = 3
	var hookRuns atomic.Int32
	h.cfg.OnDeadLetter = func(context.Context, jetstream.Msg, schemas.Code, error) error {
		hookRuns.Add(1)
		return errors.New("batch store unavailable")
	}
	h.run(func(context.Context, jetstream.Msg) error {
		return schemas.Errorf(schemas.CodeMalformed, "bad")
	})
	seq := h.publish(subject("s-1"), []byte("held"), nil)

	dl := h.waitDeadLetters(1)[0]
	if string(dl.Data) != "held" || dl.Header.Get(runner.HeaderCode) != string(schemas.CodeMalformed) || dl.Header.Get(runner.HeaderDeliveries) != "3" {
		t.Errorf("dead letter %q, code %q, deliveries %q", dl.Data, dl.Header.Get(runner.HeaderCode), dl.Header.Get(runner.HeaderDeliveries))
	}
	h.waitSettled(seq)
	if got := hookRuns.Load(); got != 3 {
		t.Errorf("the hook ran %d times, want 3", got)
	}
	if !strings.Contains(h.log.String(), "dead-lettering it anyway") {
		t.Errorf("no error logged for the work left to the sweep:\n%s", h.log.String())
	}
}

func TestFitDeadLetter(t *testing.T) {
	const maxPayload = 1 << 20
	const msgID = "dlq:stage:TOLLGATE_TURNS:42"
	own := func() nats.Header {
		h := nats.Header{}
		h.Set(runner.HeaderStage, "stage")
		h.Set(runner.HeaderCode, string(schemas.CodeMalformed))
		h.Set(runner.HeaderReason, strings.Repeat("r", 1024))
		return h
	}
	small := func() nats.Header {
		h := nats.Header{}
		h.Set("X-Trace-Id", "trace-1")
		h.Set(runner.HeaderCode, "forged") // ours wins, not counted as cut
		return h
	}
	big := func() nats.Header {
		h := padHeaders(20, 4000) // 80 KiB
		h.Set("X-Trace-Id", "trace-1")
		return h
	}
	cases := []struct {
		name            string
		copied          nats.Header
		body            int
		headersCut      bool
		bodyCut         bool
		wantCopiedWhole []string // copied headers that must be kept
	}{
		{"everything fits", small(), 1000, false, false, []string{"X-Trace-Id"}},
		{"headers too big", big(), 1000, true, false, []string{"X-Trace-Id", "X-Pad-00"}},
		{"payload too big", small(), maxPayload - 100, false, true, []string{"X-Trace-Id"}},
		{"headers and payload too big", big(), maxPayload, true, true, []string{"X-Trace-Id", "X-Pad-00"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("0123456789"), tc.body/10+1)[:tc.body]
			hdr, body := runner.FitDeadLetter(own(), tc.copied, msgID, data, maxPayload)

			hb := wireHeaderBytes(hdr, msgID)
			if hb > math.MaxUint16 {
				t.Errorf("a %d-byte header block, over JetStream's %d", hb, math.MaxUint16)
			}
			if hb+len(body) > maxPayload {
				t.Errorf("%d header and %d body bytes, over the %d payload limit", hb, len(body), maxPayload)
			}
			for k, v := range own() {
				if hdr.Get(k) != v[0] {
					t.Errorf("own header %s = %q, want %q", k, hdr.Get(k), v[0])
				}
			}
			for _, k := range tc.wantCopiedWhole {
				if hdr.Get(k) != tc.copied.Get(k) {
					t.Errorf("copied header %s was not kept whole", k)
				}
			}

			// Every copied header is kept whole or counted as cut.
			keptKeys := 0
			for k := range tc.copied {
				if _, ours := own()[k]; !ours && hdr.Get(k) == tc.copied.Get(k) {
					keptKeys++
				}
			}
			mark := hdr.Get(runner.HeaderHeadersTruncated)
			if !tc.headersCut {
				if mark != "" || keptKeys != len(tc.copied)-1 {
					t.Errorf("kept %d of %d copied headers, mark %q; want all and no mark", keptKeys, len(tc.copied)-1, mark)
				}
			} else {
				var keys, size int
				if _, err := fmt.Sscanf(mark, "%d keys, %d bytes", &keys, &size); err != nil || keys < 1 || keptKeys+keys != len(tc.copied) || size < keys*4000 {
					t.Errorf("mark %q with %d of %d copied headers kept", mark, keptKeys, len(tc.copied))
				}
			}

			if !bytes.HasPrefix(data, body) {
				t.Fatalf("the body is not a prefix of the original")
			}
			if got := hdr.Get(runner.HeaderTruncated); tc.bodyCut {
				if len(body) >= len(data) || got != strconv.Itoa(len(data)) {
					t.Errorf("body of %d of %d bytes, %s = %q", len(body), len(data), runner.HeaderTruncated, got)
				}
				if hb+len(body) < maxPayload-1024 {
					t.Errorf("cut to %d bytes with the headers, more than needed under %d", hb+len(body), maxPayload)
				}
			} else if len(body) != len(data) || got != "" {
				t.Errorf("body of %d of %d bytes, %s = %q; want it whole and unmarked", len(body), len(data), runner.HeaderTruncated, got)
			}
		})
	}
}
