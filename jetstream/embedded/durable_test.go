package embedded_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// A server with the production setting (sync_interval: always) is restarted
// while accepted turns are being published asynchronously. Every publish it
// acknowledged, before, during or after the restart, is in the stream
// afterwards at the sequence its ack named, with its bytes; the publishes
// that failed during the restart, sent again with the same message ids,
// are stored once each.
//
// What this does not show: that an fsync'd write survives a power loss. A
// clean shutdown flushes the store whatever the sync setting, and even a
// killed process leaves its writes in the OS page cache; only a machine
// crash tells the settings apart (docs/operations.md).
func TestAcknowledgedTurnsSurviveARestartMidLoad(t *testing.T) {
	env := jstest.StartWith(t, jstest.Options{SyncAlways: true})
	if c := env.Server.JetStreamConfig(); c == nil || !c.SyncAlways {
		t.Fatalf("JetStream config %+v, want SyncAlways", c)
	}
	const total, restartAfter = 1500, 400
	msgs := make([]*nats.Msg, total)
	for i := range msgs {
		hdr := nats.Header{}
		hdr.Set(jetstream.MsgIDHeader, fmt.Sprintf("cli:m-%d", i))
		msgs[i] = &nats.Msg{
			Subject: topology.AcceptedSubject(fmt.Sprintf("s-%d", i%16)),
			Header:  hdr,
			Data:    bytes.Repeat(fmt.Appendf(nil, "turn %d;", i), 300/len(fmt.Sprintf("turn %d;", i))),
		}
	}

	load := jstest.StartLoad(t, env.NC, time.Second, msgs, restartAfter)
	ackedBefore, unsettled := load.RestartMidLoad(env)
	if c := env.Server.JetStreamConfig(); c == nil || !c.SyncAlways {
		t.Fatalf("after the restart: JetStream config %+v, want SyncAlways", c)
	}
	acked, failed := load.Wait()
	if len(acked) <= ackedBefore {
		t.Fatalf("no publish was acknowledged after the restart (%d before, %d in all)", ackedBefore, len(acked))
	}
	ctx := jstest.Ctx(t)
	dups := load.Resend(ctx)
	acked, _ = load.Wait()
	t.Logf("%d turns: %d acknowledged before the restart (%d unsettled), %d acknowledged by the first attempt, %d resent (%d of them already stored)",
		total, ackedBefore, unsettled, total-len(failed), len(failed), dups)

	s, err := env.JS.Stream(ctx, topology.StreamTurns)
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[uint64]string{}
	for i, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		seq, ok := acked[id]
		if !ok {
			t.Fatalf("%s was never acknowledged", id)
		}
		if other, dup := seqs[seq]; dup {
			t.Fatalf("%s and %s were both acknowledged at sequence %d", other, id, seq)
		}
		seqs[seq] = id
		got, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("turn %d (%s), acknowledged at sequence %d, is lost: %v", i, id, seq, err)
		}
		if got.Header.Get(jetstream.MsgIDHeader) != id || got.Subject != m.Subject || !bytes.Equal(got.Data, m.Data) {
			t.Fatalf("sequence %d holds %s on %s (%d bytes), but %s (%d bytes) was acknowledged there",
				seq, got.Header.Get(jetstream.MsgIDHeader), got.Subject, len(got.Data), id, len(m.Data))
		}
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != total {
		t.Fatalf("the stream holds %d messages for %d turns: a resent turn was stored twice", info.State.Msgs, total)
	}
}
