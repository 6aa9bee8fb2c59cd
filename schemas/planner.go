package schemas

import (
	"strconv"
	"strings"
	"time"
)

// Records of the planner stage (pipeline/planner). They live in KV bucket
// tollgate_planner (turns, steps, sessions' conversations and loop queues)
// and, for the reply, on the events stream. See docs/planner.md.

// Schema versions of the planner's records.
const (
	PlannerTurnVersion  = 1
	PlannerStepVersion  = 1
	ConversationVersion = 1
	PlannerQueueVersion = 1
	ReplyEventVersion   = 1
)

// PlannerState is the state of a planner turn (an agent loop).
type PlannerState string

const (
	PlannerQueued    PlannerState = "queued"    // waiting for its session's running loop
	PlannerRunning   PlannerState = "running"   // the loop runs (a model step or a batch)
	PlannerCompleted PlannerState = "completed" // terminal: the model answered with text
	PlannerFailed    PlannerState = "failed"    // terminal: budget, model or authority failure
)

// Terminal reports whether s is a final state.
func (s PlannerState) Terminal() bool { return s == PlannerCompleted || s == PlannerFailed }

// PlannerTurn is an accepted text-only turn as the planner drives it, kept
// under its turn id. Context is the turn's sealed TurnContext exactly as
// ingest published it: every step batch runs under it, and nothing else.
type PlannerTurn struct {
	V         Version      `msgpack:"v"`
	TurnID    string       `msgpack:"turn_id"`
	SessionID string       `msgpack:"session_id"`
	Context   *TurnContext `msgpack:"context"`
	Text      string       `msgpack:"text"`
	State     PlannerState `msgpack:"state"`
	// Step is the index of the step the loop is at (0 first).
	Step int `msgpack:"step"`
	// TokensIn and TokensOut add up the usage of every recorded step.
	TokensIn  int64  `msgpack:"tokens_in"`
	TokensOut int64  `msgpack:"tokens_out"`
	Code      Code   `msgpack:"code,omitempty"`
	Reason    string `msgpack:"reason,omitempty"`
	Reply     string `msgpack:"reply,omitempty"` // the final text, once completed
	// SupersededBy is the newer planner turn of the session that
	// superseded this loop (session policy busy: supersede): the loop
	// takes no further step and fails TURN_SUPERSEDED.
	SupersededBy string    `msgpack:"superseded_by,omitempty"`
	StartedAt    time.Time `msgpack:"started_at"` // when the loop started (wall-time budget)
	UpdatedAt    time.Time `msgpack:"updated_at"`
	// OrderSeq and OrderAfter are the turn's place in its session's order
	// (BatchRecord's fields of the same names), kept until the loop's
	// batch record is created with them. Zero and empty for a turn that
	// did not come as an entry, and on every record an earlier version
	// wrote.
	OrderSeq   uint64 `msgpack:"order_seq,omitempty"`
	OrderAfter string `msgpack:"order_after,omitempty"`
}

// PlannerCall is one tool call the model asked for in a step. A call that
// cannot run (unknown tool, arguments that are not a JSON object or fail
// the tool's schema, over the batch limit) has a Code and Reason and is
// never put into a batch; it goes back to the model as an error. The others
// are the step batch's calls, in order: BatchIndex is the call's index
// there.
type PlannerCall struct {
	ID         string `msgpack:"id"` // the model's tool_call id
	Tool       string `msgpack:"tool"`
	Args       string `msgpack:"args"`
	BatchIndex int    `msgpack:"batch_index"` // -1: not in the batch
	Code       Code   `msgpack:"code,omitempty"`
	Reason     string `msgpack:"reason,omitempty"`
}

// PlannerStep is one model step of a planner turn, kept under
// PlannerStepKey(turn, index). It is created (KV create) once the model's
// answer is in, so a redelivered step finds the answer and does not ask the
// model again; Results are set (compare-and-set) once the step's batch has
// ended.
type PlannerStep struct {
	V      Version       `msgpack:"v"`
	TurnID string        `msgpack:"turn_id"`
	Index  int           `msgpack:"index"`
	Text   string        `msgpack:"text,omitempty"` // the model's text content
	Calls  []PlannerCall `msgpack:"calls,omitempty"`
	// Batch is the step batch's turn id (PlannerStepTurnID), "" when no
	// call could run.
	Batch string `msgpack:"batch,omitempty"`
	// Results are the batch's results, by batch index, once it ended.
	Results   []ToolResult `msgpack:"results,omitempty"`
	Ended     bool         `msgpack:"ended"` // the batch ended (or there was none)
	TokensIn  int64        `msgpack:"tokens_in"`
	TokensOut int64        `msgpack:"tokens_out"`
	CreatedAt time.Time    `msgpack:"created_at"`
}

// Final reports whether the step is the model's final answer: text and no
// tool calls.
func (s *PlannerStep) Final() bool { return len(s.Calls) == 0 }

// ConversationMessage is one message of a session's durable conversation:
// a user's text ("user") or the planner's final reply ("assistant").
type ConversationMessage struct {
	Role   string    `msgpack:"role"`
	Text   string    `msgpack:"text"`
	TurnID string    `msgpack:"turn_id"`
	At     time.Time `msgpack:"at"`
}

// Conversation is a session's durable conversation as the planner offers
// it to the model, kept under ConversationKey(session key). It holds only
// what the people said and the final replies (not tool calls), oldest
// first, cut to the planner's limits when written.
type Conversation struct {
	V         Version               `msgpack:"v"`
	SessionID string                `msgpack:"session_id"`
	Messages  []ConversationMessage `msgpack:"messages"`
	UpdatedAt time.Time             `msgpack:"updated_at"`
}

// PlannerQueue runs a session's agent loops one at a time: Active is the
// planner turn whose loop runs, Queue later ones in arrival order. Kept
// under PlannerQueueKey(session key).
type PlannerQueue struct {
	V         Version   `msgpack:"v"`
	SessionID string    `msgpack:"session_id"`
	Active    string    `msgpack:"active"`
	Queue     []string  `msgpack:"queue"`
	UpdatedAt time.Time `msgpack:"updated_at"`
}

// ReplyEvent is the planner's final answer to a turn, published once on
// tollgate.event.turn.reply.<turn id>. Reply and Audience come only from
// the turn's verified TurnContext (the rule of batch.Outcome); a turn whose
// context does not verify gets no reply event at all.
type ReplyEvent struct {
	V         Version     `msgpack:"v"`
	TurnID    string      `msgpack:"turn_id"`
	SessionID string      `msgpack:"session_id"`
	Text      string      `msgpack:"text"`
	Reply     ReplyTarget `msgpack:"reply"`
	Audience  Audience    `msgpack:"audience"`
	Steps     int         `msgpack:"steps"`
	At        time.Time   `msgpack:"at"`
}

// PlannerStepTurnID is the turn id of the batch of step index of planner
// turn turnID: turnID "-p" index. It extends turnID, so the step batch runs
// under turnID's TurnContext (TurnContext.CheckFor accepts it).
func PlannerStepTurnID(turnID string, index int) string {
	return turnID + "-p" + strconv.Itoa(index)
}

// PlannerStepOf returns the planner turn and step index of a step batch's
// turn id, or ok false when turnID is not of PlannerStepTurnID's form.
func PlannerStepOf(turnID string) (root string, index int, ok bool) {
	i := strings.LastIndex(turnID, "-p")
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(turnID[i+2:])
	if err != nil || n < 0 || strconv.Itoa(n) != turnID[i+2:] {
		return "", 0, false
	}
	return turnID[:i], n, true
}

// PlannerStepKey is the KV key of step index of planner turn turnID.
func PlannerStepKey(turnID string, index int) string {
	return turnID + ".step." + strconv.Itoa(index)
}

// ConversationKey is the KV key of the conversation of the session with
// key sessionKey.
func ConversationKey(sessionKey string) string { return "conversation." + sessionKey }

// PlannerQueueKey is the KV key of the loop queue of the session with key
// sessionKey.
func PlannerQueueKey(sessionKey string) string { return "queue." + sessionKey }

// DescendsFrom reports whether turnID is work that inherits the
// TurnContext of turn rootTurnID: a chain of follow-up ("-<index>-f") and
// planner step ("-p<index>") extensions of rootTurnID, at least one.
func DescendsFrom(turnID, rootTurnID string) bool {
	rest, ok := strings.CutPrefix(turnID, rootTurnID)
	if !ok || rest == "" {
		return false
	}
	for rest != "" {
		if len(rest) < 3 || rest[0] != '-' {
			return false
		}
		step := rest[1] == 'p'
		i := 1
		if step {
			i = 2
		}
		j := i
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		if j == i {
			return false
		}
		if step {
			rest = rest[j:]
			continue
		}
		if !strings.HasPrefix(rest[j:], "-f") {
			return false
		}
		rest = rest[j+2:]
	}
	return true
}

func (t *PlannerTurn) schemaVersion() Version   { return t.V }
func (t *PlannerTurn) currentVersion() Version  { return PlannerTurnVersion }
func (t *PlannerTurn) stampVersion()            { t.V = PlannerTurnVersion }
func (s *PlannerStep) schemaVersion() Version   { return s.V }
func (s *PlannerStep) currentVersion() Version  { return PlannerStepVersion }
func (s *PlannerStep) stampVersion()            { s.V = PlannerStepVersion }
func (c *Conversation) schemaVersion() Version  { return c.V }
func (c *Conversation) currentVersion() Version { return ConversationVersion }
func (c *Conversation) stampVersion()           { c.V = ConversationVersion }
func (q *PlannerQueue) schemaVersion() Version  { return q.V }
func (q *PlannerQueue) currentVersion() Version { return PlannerQueueVersion }
func (q *PlannerQueue) stampVersion()           { q.V = PlannerQueueVersion }
func (e *ReplyEvent) schemaVersion() Version    { return e.V }
func (e *ReplyEvent) currentVersion() Version   { return ReplyEventVersion }
func (e *ReplyEvent) stampVersion()             { e.V = ReplyEventVersion }

func (t *PlannerTurn) validate() error {
	switch t.State {
	case PlannerQueued, PlannerRunning, PlannerCompleted, PlannerFailed:
	default:
		return Errorf(CodeInvalidInput, "state %q is not a planner state", t.State)
	}
	if err := checkPlace(t.OrderSeq, t.OrderAfter); err != nil {
		return err
	}
	return firstErr(
		checkString("turn_id", t.TurnID, MaxIDBytes, true, false),
		checkString("session_id", t.SessionID, MaxIDBytes, true, false),
	)
}

func (s *PlannerStep) validate() error {
	if s.Index < 0 {
		return Errorf(CodeInvalidInput, "step index %d is negative", s.Index)
	}
	return checkString("turn_id", s.TurnID, MaxIDBytes, true, false)
}

func (c *Conversation) validate() error {
	return checkString("session_id", c.SessionID, MaxIDBytes, true, false)
}

func (q *PlannerQueue) validate() error {
	return checkString("session_id", q.SessionID, MaxIDBytes, true, false)
}

func (e *ReplyEvent) validate() error {
	return firstErr(
		checkString("turn_id", e.TurnID, MaxIDBytes, true, false),
		checkString("session_id", e.SessionID, MaxIDBytes, true, false),
	)
}
