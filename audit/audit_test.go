package audit

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// A batch's move is told from its record after the write: the state, who
// requested the turn, and what the state waits for or ended with.
func TestBatchEvent(t *testing.T) {
	at := Event{Time: time.Unix(1, 0).UTC(), Stream: "TOLLGATE_TURNLOG_2", Seq: 7}
	ctx := &schemas.TurnContext{Requester: schemas.Requester{Principal: "cli:alice"}}
	for _, tc := range []struct {
		name string
		b    schemas.BatchRecord
		want Event
	}{
		{"awaiting counts the approvals it waits for",
			schemas.BatchRecord{TurnID: "t-1", SessionID: "s-1", Context: ctx, State: schemas.BatchAwaiting, Approvals: []string{"", "a-1-1", "a-1-2"}},
			Event{Kind: Batch, TurnID: "t-1", SessionID: "s-1", Requester: "cli:alice", Status: "awaiting", Pending: 2}},
		{"failed keeps its code, reason and results",
			schemas.BatchRecord{TurnID: "t-1", State: schemas.BatchFailed, Code: schemas.CodeBatchStateInvalid, Reason: "why",
				Results: []*schemas.ToolResult{{CallID: "t-1-0"}, nil}},
			Event{Kind: Batch, TurnID: "t-1", Status: "failed", Code: string(schemas.CodeBatchStateInvalid), Reason: "why", Results: 1}},
		{"started is the state alone",
			schemas.BatchRecord{TurnID: "t-1", State: schemas.BatchStarted, Approvals: []string{"a-1-0"}, Results: []*schemas.ToolResult{{}}},
			Event{Kind: Batch, TurnID: "t-1", Status: "started"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := batchEvent(at, &tc.b)
			want := tc.want
			want.Time, want.Stream, want.Seq = at.Time, at.Stream, at.Seq
			if got.Kind != want.Kind || got.TurnID != want.TurnID || got.SessionID != want.SessionID || got.Requester != want.Requester ||
				got.Status != want.Status || got.Code != want.Code || got.Reason != want.Reason || got.Pending != want.Pending ||
				got.Results != want.Results || got.Time != want.Time || got.Stream != want.Stream || got.Seq != want.Seq {
				t.Fatalf("batchEvent = %+v, want %+v", got, want)
			}
		})
	}
}
