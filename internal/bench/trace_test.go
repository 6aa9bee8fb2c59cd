package bench

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The tracer names the turn logs' operations as the raw sequences do: the
// append of a batch record is a log.append on the turn's event subject (a
// durable write), a read of the turn's last event a stream.get of the
// turn's wildcard, whether it is a direct get or a stream message get, and
// the partition is <p> whatever the turn's hash; a KV get and another
// stream's last-message get keep their names.
func TestTraceNamesTheTurnLogsOperations(t *testing.T) {
	hdr := nats.Header{}
	hdr.Set(jetstream.ExpectedLastSubjSeqHeader, "12")
	hdr.Set(jetstream.ExpectedLastSubjSeqSubjHeader, "tollgate.turnlog.3.t-1.>")
	hdr.Set(jetstream.MsgIDHeader, "t-1.running.12.0011223344556677")
	msgs := []*nats.Msg{
		{Subject: "tollgate.turnlog.3.t-1.running", Header: hdr, Data: make([]byte, 100)},
		{Subject: "$JS.API.DIRECT.GET.TOLLGATE_TURNLOG_3.tollgate.turnlog.3.t-1.>"},
		{Subject: "$JS.API.STREAM.MSG.GET.TOLLGATE_TURNLOG_12", Data: []byte(`{"last_by_subj":"tollgate.turnlog.12.t-1.>"}`)},
		{Subject: "$JS.API.DIRECT.GET.KV_tollgate_batches.$KV.tollgate_batches.t-1"},
		{Subject: "$JS.API.DIRECT.GET.TOLLGATE_EVENTS", Data: []byte(`{"last_by_subj":"tollgate.event.turn.outcome.t-1"}`)},
		{Subject: "$JS.ACK.TOLLGATE_EVENTS.redriver.1.2.3.4.5.0", Data: []byte("+ACK")},
	}
	var ops []tracedOp
	for _, m := range msgs {
		ops = append(ops, classify(m))
	}
	got := canonical(ops, [][2]string{{"t-1", "<turn>"}}, stageOfConsumer)
	want := []step{
		{Stage: "redriver", Op: "log.append", On: "tollgate.turnlog.<p>.<turn>.running", MsgID: true, Bytes: 100},
		{Stage: "redriver", Op: "stream.get", On: "TOLLGATE_TURNLOG_<p> last tollgate.turnlog.<p>.<turn>.>"},
		{Stage: "redriver", Op: "stream.get", On: "TOLLGATE_TURNLOG_<p> last tollgate.turnlog.<p>.<turn>.>"},
		{Stage: "redriver", Op: "kv.get", On: "tollgate_batches/<turn>"},
		{Stage: "redriver", Op: "stream.get", On: "TOLLGATE_EVENTS last tollgate.event.turn.outcome.<turn>"},
		{Stage: "redriver", Op: "consume+ack", On: "TOLLGATE_EVENTS/redriver"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("traced:\n%v\nwant:\n%v", got, want)
	}
	if w := countWrites(got); w != (Writes{Publishes: 1, Total: 1}) {
		t.Errorf("writes %+v, want the append alone", w)
	}
}
