package pipelinetest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// These benchmarks run the four stages in one process on an embedded
// server (file storage) and report whole turns per second, next to raw
// JetStream async publish measured on the same server in the same run. They
// are indicative only; `make bench` (docs/bench.md) is the full report.

// BenchmarkFastPathTurns: b.N turns of one echo call each, over 64
// sessions, published asynchronously; the clock stops when the last turn's
// outcome is stored.
func BenchmarkFastPathTurns(b *testing.B) {
	h := pt.Start(b, pt.Options{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := h.Inbound(fmt.Sprintf("s-%d", i%64), "alice", pt.Call("echo", `{"text":"hi"}`))
		data, err := schemas.Encode(m)
		if err != nil {
			b.Fatal(err)
		}
		publishAsync(b, h, topology.InboundSubject(m.Transport, m.SessionID), data, m.Transport+":"+m.MessageID)
	}
	waitOutcomes(b, h, uint64(b.N))
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
}

// BenchmarkApprovalPathTurns: b.N turns of echo + write_file each; an
// automated decider approves each request as soon as it is published.
func BenchmarkApprovalPathTurns(b *testing.B) {
	h := pt.Start(b, pt.Options{})
	// The requests: each batch's move to awaiting keeps them (its turn
	// log's awaiting event, heard live).
	sub, err := h.Env.NC.Subscribe(topology.SubjectTurnLogPrefix+"*.*."+store.EventAwaiting, func(msg *nats.Msg) {
		_, turn, _, _ := topology.ParseTurnLogSubject(msg.Subject)
		reqs, _ := store.DecodeRequested(turn, msg.Data)
		for _, a := range reqs {
			d := h.Decision(a.ApprovalID, schemas.OptionApprove, "cli", "alice")
			data, _ := schemas.Encode(d)
			_, _ = h.JS.PublishAsync(topology.DecisionSubject(d.Transport, d.ApprovalID), data, jetstream.WithMsgID(d.DecisionID))
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m := h.Inbound(fmt.Sprintf("s-%d", i%64), "alice", pt.Call("echo", `{"text":"hi"}`),
			pt.Call("write_file", fmt.Sprintf(`{"path":"f/%d","content":"x"}`, i)))
		data, err := schemas.Encode(m)
		if err != nil {
			b.Fatal(err)
		}
		publishAsync(b, h, topology.InboundSubject(m.Transport, m.SessionID), data, m.Transport+":"+m.MessageID)
	}
	waitOutcomes(b, h, uint64(b.N))
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "turns/s")
}

// BenchmarkRawAsyncPublish is the reference: JetStream async publish of a
// 300-byte message to a file-backed stream on the same kind of server.
func BenchmarkRawAsyncPublish(b *testing.B) {
	h := pt.Start(b, pt.Options{Stages: []string{}})
	ctx := context.Background()
	if _, err := h.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 300)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := h.JS.PublishAsync("raw.x", payload); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-h.JS.PublishAsyncComplete():
	case <-jstest.After(jstest.LongWait):
		b.Fatal("publishes not acknowledged")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// publishAsync publishes with a bounded window: every 256 messages it waits
// for the outstanding acks, so the client never stalls on too many pending
// publishes (which nats.go reports as an error after 200ms).
func publishAsync(b *testing.B, h *pt.H, subject string, data []byte, msgID string) {
	b.Helper()
	if _, err := h.JS.PublishAsync(subject, data, jetstream.WithMsgID(msgID)); err != nil {
		b.Fatal(err)
	}
	if h.JS.PublishAsyncPending() >= 256 {
		select {
		case <-h.JS.PublishAsyncComplete():
		case <-jstest.After(jstest.LongWait):
			b.Fatal("async publishes not acknowledged within a minute")
		}
	}
}

// waitOutcomes waits until the turn logs hold n outcome events (each the
// write that ended a turn).
func waitOutcomes(b *testing.B, h *pt.H, n uint64) {
	b.Helper()
	// The whole benchmark's load drains here: far longer than one wait.
	jstest.EventuallyState(b, 5*jstest.LongWait, fmt.Sprintf("%d outcome events", n), func() (bool, string) {
		var got uint64
		for i, s := range h.Env.Buckets.TurnLogs {
			info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(topology.TurnLogOutcomeFilter(i)))
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range info.State.Subjects {
				got += c
			}
		}
		return got >= n, fmt.Sprintf("%d outcome events", got)
	})
}
