package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Scheduler starts follow-up work on behalf of a call (see FollowUp). It is
// implemented by the pipeline (batch.Engine).
type Scheduler interface {
	// ScheduleFollowUp schedules one call of tool with args (a JSON object)
	// to be accepted as a new turn after delay, under from.Context
	// unchanged, and returns the new turn's id. Scheduling twice for the
	// same call schedules once. It refuses with code FOLLOWUP_REJECTED
	// (schemas.CodeFollowUpRejected) an invalid tool name, args that are
	// not a JSON object, a delay outside 0 to MaxFollowUpDelay and too deep
	// a chain, and schedules nothing then.
	ScheduleFollowUp(ctx context.Context, from Call, tool, args string, delay time.Duration) (string, error)
}

// MaxFollowUpDelay bounds how far ahead a follow-up may be scheduled.
const MaxFollowUpDelay = 7 * 24 * time.Hour

// FollowUp is the built-in "schedule_followup": it schedules a delayed
// follow-up call. Arguments: {"tool": "echo", "args": {...}, "delay": "30s"}
// ("args" defaults to {}, "delay" to 0s).
//
// The follow-up inherits the submitting turn's TurnContext as sealed at
// ingest (requester, audience, reply target, trust boundary): there is no
// default audience and no other authority. It becomes a turn of the same
// session, so the policy applies to it as to any call (approval, deny,
// expiry) and its outcome goes to the original reply target. It never
// starts before its delay has passed. A follow-up may itself schedule
// follow-ups, up to schemas.MaxFollowUpDepth levels.
//
// Every refusal is an error with code FOLLOWUP_REJECTED, and nothing is
// scheduled: arguments that are not a JSON object of that shape, a delay
// that is not a duration from 0s to MaxFollowUpDelay, and whatever the
// Scheduler refuses (an invalid tool name, args that are not a JSON object,
// too deep a chain, a context that does not verify). Like any tool error,
// it is the call's result (error, TOOL_FAILED, the code in its reason).
type FollowUp struct {
	// Scheduler is set once the pipeline's engine exists (the engine needs
	// the tool catalog first).
	Scheduler Scheduler
}

func (*FollowUp) Name() string { return "schedule_followup" }

// Spec implements tools.Describer. The schema checks the arguments' shape;
// what it cannot say (a valid tool name, a delay in range) Run checks and
// refuses with FOLLOWUP_REJECTED.
func (*FollowUp) Spec() Spec {
	return Spec{
		Description: "Schedules a call of another tool as a new turn of the same session after a delay, under the same requester and audience; the policy applies to it as to any call.",
		Source:      SourceBuiltin,
		InputSchema: followUpSchema,
	}
}

func (f *FollowUp) Run(ctx context.Context, c Call) (string, error) {
	if f.Scheduler == nil {
		return "", errors.New("schedule_followup: no scheduler wired")
	}
	reject := func(format string, a ...any) (string, error) {
		return "", fmt.Errorf("schedule_followup: %w", schemas.Errorf(schemas.CodeFollowUpRejected, format, a...))
	}
	var a struct {
		Tool  string          `json:"tool"`
		Args  json.RawMessage `json:"args"`
		Delay string          `json:"delay"`
	}
	if err := json.Unmarshal([]byte(c.Args), &a); err != nil {
		return reject("args: %v", err)
	}
	args := "{}"
	if len(a.Args) > 0 {
		args = string(a.Args)
	}
	var delay time.Duration
	if a.Delay != "" {
		d, err := time.ParseDuration(a.Delay)
		if err != nil {
			return reject("delay %q: want a duration from 0s to %v", a.Delay, MaxFollowUpDelay)
		}
		delay = d // its range is the Scheduler's to check
	}
	turn, err := f.Scheduler.ScheduleFollowUp(ctx, c, a.Tool, args, delay)
	if err != nil {
		return "", fmt.Errorf("schedule_followup: %w", err)
	}
	return fmt.Sprintf("scheduled %s as turn %s in %v", a.Tool, turn, delay), nil
}
