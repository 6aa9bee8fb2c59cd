package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/turnlog"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The move to awaiting keeps a batch's requests, and only it: a record
// read back carries none, so a later write while the batch waits keeps
// none either; LoggedRequest still finds the request, in the move, and
// finds none of another approval or turn.
func TestTheMoveToAwaitingKeepsTheRequestsOnce(t *testing.T) {
	env := jstest.Start(t)
	logs := store.BatchLog{Log: turnlog.Bind(env.JS, env.Buckets.TurnLogs)}
	ctx := context.Background()
	turn := schemas.TurnID("cli", "requests")
	call := schemas.ToolCall{CallID: schemas.CallID(turn, 0), Tool: "write_file", Args: `{}`, ArgsDigest: schemas.ArgsDigest(`{}`)}
	b := &schemas.BatchRecord{TurnID: turn, SessionID: "s", State: schemas.BatchRunning, Calls: []schemas.ToolCall{call},
		Approvals: []string{""}, Results: []*schemas.ToolResult{nil}, CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
	rev, err := logs.Create(ctx, turn, b)
	if err != nil {
		t.Fatal(err)
	}
	a := &schemas.ApprovalRecord{V: schemas.ApprovalVersion, ApprovalID: schemas.ApprovalID(turn, 0), TurnID: turn, SessionID: "s",
		CallID: call.CallID, Tool: call.Tool, ArgsDigest: call.ArgsDigest, Status: schemas.ApprovalPending, RequestedAt: time.Now().UTC()}
	b.State, b.Approvals[0], b.Requested = schemas.BatchAwaiting, a.ApprovalID, []*schemas.ApprovalRecord{a.AsRequested()}
	moved, err := logs.Update(ctx, turn, b, rev)
	if err != nil {
		t.Fatal(err)
	}
	// A write while it waits, made from the record as read.
	got, rev, err := logs.Get(ctx, turn)
	if err != nil || got.Requested != nil {
		t.Fatalf("the batch as read: %+v, %v; want no requests", got, err)
	}
	got.UpdatedAt = time.Now().UTC()
	if _, err := logs.Update(ctx, turn, got, rev); err != nil {
		t.Fatal(err)
	}

	streams := env.Buckets.TurnLogs
	for _, tc := range []struct {
		name, turn, id string
		seq            uint64
		ok             bool
	}{
		{"its request, in the move behind the later write", turn, a.ApprovalID, moved, true},
		{"another approval of the turn", turn, schemas.ApprovalID(turn, 1), moved, false},
		{"a turn with no log", schemas.TurnID("cli", "none"), schemas.ApprovalID(schemas.TurnID("cli", "none"), 0), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seq, ok, err := store.LoggedRequest(ctx, streams, tc.turn, tc.id)
			if err != nil || ok != tc.ok || seq != tc.seq {
				t.Fatalf("LoggedRequest: seq %d, %v, %v; want seq %d, %v", seq, ok, err, tc.seq, tc.ok)
			}
		})
	}
}
