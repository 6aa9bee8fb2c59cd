package batch_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// followUpFixture is a fixture whose clock runs an hour ahead of the
// server's, so that the follow-ups it schedules stay stored as message
// schedules (not yet due) for the test to read.
func followUpFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	f.clock.Set(time.Now().Add(time.Hour).Truncate(time.Second))
	return f
}

// parentBatch stores the batch record of turn (calls: schedule_followup at
// every index up to calls) at follow-up depth depth, with its context as
// ingest would have sealed it for root, and returns that context.
func parentBatch(t *testing.T, f *fixture, root, turn string, depth, calls int) *schemas.TurnContext {
	t.Helper()
	tc := turnContext(root)
	b := &schemas.BatchRecord{TurnID: turn, SessionID: tc.SessionID, Context: tc, State: schemas.BatchRunning,
		Approvals: make([]string, calls), Results: make([]*schemas.ToolResult, calls), FollowUpDepth: depth,
		CreatedAt: f.clock.Now(), UpdatedAt: f.clock.Now()}
	if depth > 0 {
		b.Origin = strings.TrimSuffix(turn, "-f")
	}
	for i := range calls {
		b.Calls = append(b.Calls, call(turn, i, "schedule_followup", `{}`))
	}
	if _, err := f.st.Batches.Create(ctx(t), turn, b); err != nil {
		t.Fatal(err)
	}
	return tc
}

// scheduled returns the follow-up turnID's message schedule and the
// accepted turn it carries, or nil if nothing is scheduled for it.
func scheduled(t *testing.T, f *fixture, turnID string) (*jetstream.RawStreamMsg, *schemas.AcceptedTurn) {
	t.Helper()
	s, err := f.env.JS.Stream(ctx(t), topology.StreamTurns)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx(t), topology.SubjectTurnSchedule+turnID)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		t.Fatal(err)
	}
	at, err := schemas.Decode[schemas.AcceptedTurn](m.Data)
	if err != nil {
		t.Fatal(err)
	}
	return m, at
}

// deepTurn is the turn id of follow-up work depth levels below root (each
// level scheduled by call 0).
func deepTurn(root string, depth int) string {
	id := root
	for range depth {
		id = schemas.FollowUpTurnID(schemas.CallID(id, 0))
	}
	return id
}

// Every refusal of schedule_followup is FOLLOWUP_REJECTED and schedules
// nothing.
func TestFollowUpRejections(t *testing.T) {
	f := followUpFixture(t)
	root := schemas.TurnID("cli", "rejections")
	tc := parentBatch(t, f, root, root, 0, 2)
	atLimit := deepTurn(root, schemas.MaxFollowUpDepth)
	deepTC := parentBatch(t, f, root, atLimit, schemas.MaxFollowUpDepth, 1)
	tool := &tools.FollowUp{Scheduler: f.eng}

	cases := []struct {
		name string
		tc   *schemas.TurnContext
		turn string
		args string
	}{
		{"a tool name with a space", tc, root, `{"tool":"Bad Tool"}`},
		{"a tool name with a path", tc, root, `{"tool":"echo/../x"}`},
		{"an upper-case tool name", tc, root, `{"tool":"Echo"}`},
		{"no tool", tc, root, `{"args":{"text":"x"}}`},
		{"args that are a list", tc, root, `{"tool":"echo","args":[1,2]}`},
		{"args that are a string", tc, root, `{"tool":"echo","args":"text"}`},
		{"args that are null", tc, root, `{"tool":"echo","args":null}`},
		{"a negative delay", tc, root, `{"tool":"echo","delay":"-1s"}`},
		{"a delay past the maximum", tc, root, `{"tool":"echo","delay":"169h"}`},
		{"a delay that is not a duration", tc, root, `{"tool":"echo","delay":"soon"}`},
		{"arguments that are not JSON", tc, root, `schedule echo`},
		{"arguments that are not an object", tc, root, `["echo"]`},
		{"a chain already at the depth limit", deepTC, atLimit, `{"tool":"echo"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			callID := schemas.CallID(c.turn, 0)
			out, err := tool.Run(ctx(t), tools.Call{Context: c.tc, CallID: callID, Args: c.args})
			if schemas.CodeOf(err) != schemas.CodeFollowUpRejected {
				t.Fatalf("Run: %q, %v; want %s", out, err, schemas.CodeFollowUpRejected)
			}
			if m, _ := scheduled(t, f, schemas.FollowUpTurnID(callID)); m != nil {
				t.Fatalf("a refused follow-up was scheduled: %s", m.Header)
			}
		})
	}

	// The same call with valid arguments is scheduled: the absence above
	// is not a failure to see schedules.
	ok := schemas.CallID(root, 1)
	if _, err := tool.Run(ctx(t), tools.Call{Context: tc, CallID: ok, Args: `{"tool":"echo.v2","args":{"text":"x"},"delay":"1s"}`}); err != nil {
		t.Fatalf("valid follow-up: %v", err)
	}
	if m, at := scheduled(t, f, schemas.FollowUpTurnID(ok)); m == nil || at.Calls[0].Tool != "echo.v2" {
		t.Fatalf("the valid follow-up was not scheduled")
	}
}

// A turn's follow-up depth is its parent's plus one, carried in the
// accepted turn and the batch record, never counted from the id: a turn id
// whose hash starts with "f" ("t-f...") contains one more "-f" than its
// depth.
func TestFollowUpDepthIsCarriedNotCountedFromTheID(t *testing.T) {
	f := followUpFixture(t)
	cases := []struct {
		name  string
		root  string
		depth int // of the scheduling turn
	}{
		{"a turn from an inbound message", schemas.TurnID("cli", "depth"), 0},
		{"a turn id starting with t-f, one level below the limit", "t-f0e1d2c3b4a596877869", schemas.MaxFollowUpDepth - 1},
		{"an ordinary turn id, one level below the limit", "t-0a1b2c3d4e5f60718293", schemas.MaxFollowUpDepth - 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			turn := deepTurn(c.root, c.depth)
			tc := parentBatch(t, f, c.root, turn, c.depth, 1)
			from := tools.Call{Context: tc, CallID: schemas.CallID(turn, 0)}
			id, err := f.eng.ScheduleFollowUp(ctx(t), from, "echo", `{}`, time.Second)
			if err != nil {
				t.Fatalf("schedule at depth %d: %v", c.depth+1, err)
			}
			_, at := scheduled(t, f, id)
			if at == nil || at.FollowUpDepth != c.depth+1 || at.Origin != from.CallID {
				t.Fatalf("scheduled %+v, want depth %d from %s", at, c.depth+1, from.CallID)
			}
		})
	}
}

// The message schedule is due at or after the follow-up's not_before,
// never before: "@at" has whole seconds, so a fraction rounds up.
func TestFollowUpScheduleIsNeverBeforeNotBefore(t *testing.T) {
	f := followUpFixture(t)
	root := schemas.TurnID("cli", "due")
	base := f.clock.Now() // a whole second
	cases := []struct {
		name  string
		frac  time.Duration // of the clock when scheduling
		delay time.Duration
		want  time.Time // the schedule's time
	}{
		{"a due time with a fraction rounds up", 400 * time.Millisecond, 1500 * time.Millisecond, base.Add(2 * time.Second)},
		{"a due time a nanosecond past a second rounds up", time.Nanosecond, 0, base.Add(time.Second)},
		{"a due time on a whole second stays", 0, 2 * time.Second, base.Add(2 * time.Second)},
	}
	tc := parentBatch(t, f, root, root, 0, len(cases))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.clock.Set(base.Add(c.frac))
			id, err := f.eng.ScheduleFollowUp(ctx(t), tools.Call{Context: tc, CallID: schemas.CallID(root, i)}, "echo", `{}`, c.delay)
			if err != nil {
				t.Fatal(err)
			}
			m, at := scheduled(t, f, id)
			if m == nil {
				t.Fatal("nothing scheduled")
			}
			if want := base.Add(c.frac + c.delay); !at.NotBefore.Equal(want) {
				t.Fatalf("not_before %v, want %v", at.NotBefore, want)
			}
			v, ok := strings.CutPrefix(m.Header.Get("Nats-Schedule"), "@at ")
			due, err := time.Parse(time.RFC3339, v)
			if !ok || err != nil {
				t.Fatalf("Nats-Schedule %q", m.Header.Get("Nats-Schedule"))
			}
			if due.Before(at.NotBefore) || !due.Equal(c.want) {
				t.Fatalf("scheduled at %v for not_before %v, want %v", due, at.NotBefore, c.want)
			}
		})
	}
}
