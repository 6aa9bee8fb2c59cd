// Package planner is the stage that closes the agent loop: a chat message
// with text and no tool calls becomes model steps, batches of tool calls,
// results fed back to the model, and a reply, all under the turn's one
// sealed TurnContext and durable step by step. docs/planner.md explains it
// for operators; this is the contract.
//
// # Which turns
//
// Where a planner runs, ingest publishes an accepted turn with text and no
// calls on topology.PlanSubject instead of the accepted subject
// (ingest.Config.Plan). A turn with calls keeps its path to the executor,
// unchanged. The planner keeps each such turn as a schemas.PlannerTurn in
// bucket tollgate_planner, holding the TurnContext exactly as ingest sealed
// it. That context must verify (seal.KeyRing.Verify, TurnContext.CheckFor):
// a turn whose context does not is failed closed at once, with its code,
// and no model is asked.
//
// # Session order
//
// A session has one order, whichever stage runs its turns: its entries in
// TOLLGATE_TURNS (docs/protocol.md §1.4, §5.4), shared with the executor.
// A planner turn T comes as an entry (topology.OrderPlan) and keeps its
// place (schemas.PlannerTurn's, then its batch record's OrderSeq and
// OrderAfter, batch.Engine.Place):
//
//   - T's batch record is created first, queued, with Plan set and no calls
//     of its own (the executor never runs such a record; it is the
//     planner's);
//   - T's loop starts once its turn has come (batch.Engine.ItsTurn: the
//     batch before it in the order, a turn with calls or another loop, has
//     ended); until then T waits, and the end of the batch before it
//     announces it on topology.PlanReadySubject.
//
// The loop holds the session from its first model step to its end: no
// later batch of the session runs until T's batch ends. Its step batches
// run inside T's turn: the executor runs a step batch of T at once while
// T's batch is running (BatchRecord.HeldBy), so no other batch of the
// session runs between or beside T's steps, and a turn that arrives
// meanwhile, with calls or without, waits for as long as the loop runs (a
// person may take days). T's end (batch.Engine.Finish of its terminal
// batch record) announces the session's next turn. A turn an earlier
// version recorded without a place takes the session record's queue, as
// it did then (batch.Engine.Acquire and Release).
//
// Where the session policy says supersede (policy sessions.busy), a turn
// that waits behind the running loop supersedes it instead
// (batch.Engine.SupersedeBefore): the loop is marked on its batch record
// (SupersededBy), takes no further model step and fails TURN_SUPERSEDED,
// and if its step batch waits on approvals they are abandoned, so the model
// never acts on them.
//
// Upgrade: a loop that an earlier version was running in the planner's own
// loop queue (schemas.PlannerQueue) keeps its session until it ends: a new
// turn of the session waits behind it in that queue, and the old loop's end
// hands it on (legacyGate, legacyRelease in loop.go).
//
// # One step
//
// Step n of turn T asks the model once. The request is: the system prompt
// (Config.SystemPrompt); the session's durable conversation (Conversation,
// below); T's text; then for each earlier step of T the model's message
// (text and tool calls) and one tool message per call with its result. The
// tools offered are the catalog's tools whose policy mode for T's audience
// is not deny, as function definitions with their JSON Schemas (a tool name
// with dots is offered with "__" in place of each dot, since function
// names may not hold dots). Tools denied for the audience are never
// offered, nor are the gate tools of Claude Code's hooks (claude.*,
// schemas.IsGateTool): a model that names one anyway is refused
// TOOL_NOT_FOUND, as over MCP.
//
// The answer is recorded as a schemas.PlannerStep under
// schemas.PlannerStepKey(T, n) by KV create, before anything else happens.
// A step found recorded is never asked again: a redelivery, a crash after
// the answer or a second worker goes on from the recorded answer (a second
// worker that asked too keeps the recorded one and drops its own).
//
// The model's tool calls are checked before anything runs: an unknown tool,
// arguments that are not a JSON object, arguments that fail the tool's JSON
// Schema, or more calls than a batch may hold are never executed; each goes
// back to the model as an error result in the next step. The other calls,
// in order, become the step's batch: an accepted turn with id
// schemas.PlannerStepTurnID(T, n), Origin T, and T's TurnContext unchanged,
// published on topology.StepSubject with message id topology.StepMsgID.
// Ingest, not the planner, publishes it on the session's accepted subject
// (ingest.HandleStep), only as T's own work under T's verified context; no
// timer stands between them. The executor creates its batch by KV create, so
// a step's batch exists at most once however often it is published (a step
// batch an earlier version stored as a message schedule on
// topology.SubjectTurnSchedule still fires after an upgrade, and the loop
// goes on from its outcome as from any other). From
// there the batch goes through the checks of any batch: authority, schema,
// policy (a tool the model was not offered, asked for anyway, is denied by
// the policy, not by the planner) and approval. Nothing a model says or a
// tool returns changes the TurnContext, the policy or who may decide.
//
// When the step batch's outcome arrives (topology.SubjectTurnOutcome,
// consumer planner-outcomes), its results are stored on the step (Ended,
// by compare-and-set) and the loop asks the model again. Every call gets a
// result the model can read: the tool's output, or a JSON object with the
// status (denied, failed, needs_attention, error) and the code and reason
// (POLICY_DENIED, APPROVAL_DENIED, APPROVAL_EXPIRED, ...).
//
// # End of a loop
//
// The loop ends when the model answers with text and no tool calls
// (completed), or fails: BUDGET_EXHAUSTED before a step that would exceed
// Budget.MaxSteps, Budget.MaxTokens (prompt and completion tokens of all
// steps) or Budget.MaxWall (since the loop started, waits for people
// included); LLM_UNAVAILABLE when the endpoint cannot be reached or keeps
// failing after the client's retries (back-off on 429 and 5xx);
// LLM_BAD_RESPONSE when it answers with something that is not a usable
// completion. A stopping planner (its context cancelled) fails nothing: the
// turn goes on from its records when it is redelivered. A message the
// planner gives up on (dead-lettered: a panic, retries exhausted) fails the
// turn it was driving with the dead letter's code, so that the turn still
// has its one outcome and its session's next loop runs.
//
// Ending is idempotent and in this order: the PlannerTurn's terminal state
// (compare-and-set; the worker whose write ends it counts its metrics); the
// reply event (completed only) on topology.SubjectTurnReply with message id
// topology.ReplyMsgID, whose reply target and audience come only from the
// verified TurnContext, exactly as batch.Outcome's do (no verified context,
// no reply event); the conversation; T's batch record, terminal, with no
// calls (made by KV create where it is missing), whose write keeps T's
// TurnOutcome (batch.Outcome, as for every batch: the turn log's outcome
// event, docs/protocol.md §4.2a; after the reply, so that the reply is
// among the turn's events stored before its outcome); batch.Engine.Finish
// of T's batch record, which publishes that same outcome; and the
// session's loop queue, whose next turn is announced.
//
// # Conversation
//
// A session's conversation (schemas.Conversation) holds each completed
// turn's user text and final reply, oldest first. Tool calls and results
// of earlier turns are not kept. Truncation rule: when a turn is appended,
// and again when a request is built, the oldest messages are dropped one
// by one until at most History.MaxMessages remain and their text is at most
// History.MaxBytes; the current turn's text, calls and results are never
// dropped (the step budget bounds them).
//
// # Retention
//
// With Config.Retention (tollgate.Config.Retention), the planner's records
// leave its bucket as the others leave theirs (pipeline/store): a planner
// turn a retention period after the write that ended it, its steps from
// when finish retires them (before the turn's outcome is published), and a
// session's conversation a retention period after its last write (each
// completed loop writes it again). A running loop's records never expire.
// The bucket keeps one revision per key and allows per-message TTLs
// (topology.PlannerBucketStream).
//
// # Metrics
//
// tollgate_planner_tokens_total{direction="in"|"out"}, the model's
// tollgate_planner_model_seconds, tollgate_planner_steps (per ended turn),
// tollgate_planner_budget_exhausted_total and
// tollgate_planner_model_errors_total{code}, on Config.Registerer.
package planner
