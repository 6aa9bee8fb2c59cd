package schemas

import (
	"errors"
	"fmt"
	"strings"
)

// Code is a stable, machine-readable reason code. Codes reach users (decision
// rejections, tool results, turn outcomes) and the dead-letter stream, so a
// code, once published, never changes meaning.
type Code string

// Reason codes. See docs/protocol.md for the full table.
const (
	// Decoding and validation of input.
	CodeMalformed                Code = "MALFORMED_PAYLOAD"
	CodeSchemaVersionUnsupported Code = "SCHEMA_VERSION_UNSUPPORTED"
	CodeInvalidInput             Code = "INVALID_INPUT"
	CodeArgsInvalidJSON          Code = "ARGS_INVALID_JSON"
	CodePayloadTooLarge          Code = "PAYLOAD_TOO_LARGE"

	// Authority.
	CodeTurnContextMissing   Code = "TURN_CONTEXT_MISSING"
	CodeTurnContextInvalid   Code = "TURN_CONTEXT_INVALID"
	CodeTurnContextMismatch  Code = "TURN_CONTEXT_MISMATCH"
	CodeNoInteractiveRequest Code = "NO_INTERACTIVE_REQUESTER"
	// CodeTurnContextTampered: the seal is missing or does not match the
	// context's fields (edited in storage or forged).
	CodeTurnContextTampered Code = "TURN_CONTEXT_TAMPERED"
	// CodeSealKeyUnknown: the seal names a key this worker does not hold
	// (rotated out, or never issued).
	CodeSealKeyUnknown Code = "SEAL_KEY_UNKNOWN"
	// CodeLegacyContextIncomplete: a version 1 approval record lacks an
	// authority field needed to restore its context.
	CodeLegacyContextIncomplete Code = "LEGACY_CONTEXT_INCOMPLETE"
	// CodePolicyChanged: since the approval was requested, the policy came
	// to deny the tool or no longer authorizes the decider.
	CodePolicyChanged Code = "POLICY_CHANGED"
	// CodeTurnSuperseded: a newer turn of the session superseded the turn
	// while it waited for approvals.
	CodeTurnSuperseded Code = "TURN_SUPERSEDED"
	// CodeFollowUpRejected: a follow-up could not be scheduled (bad target,
	// too deep a chain).
	CodeFollowUpRejected Code = "FOLLOWUP_REJECTED"

	// Decisions.
	CodeApprovalNotFound       Code = "APPROVAL_NOT_FOUND"
	CodeApprovalAlreadyDecided Code = "APPROVAL_ALREADY_DECIDED"
	CodeApprovalExpired        Code = "APPROVAL_EXPIRED"
	CodeOptionNotOffered       Code = "OPTION_NOT_OFFERED"
	CodeDeciderNotAuthorized   Code = "DECIDER_NOT_AUTHORIZED"
	CodeArgsDigestMismatch     Code = "ARGS_DIGEST_MISMATCH"

	// Standing grants (docs/protocol.md, "Grants").

	// CodeGrantRevoked: the grant that approved a call was revoked, or the
	// policy no longer offers its option (or no longer lets its principal
	// decide the tool), or its record is gone, before the call ran; the
	// call does not run.
	CodeGrantRevoked Code = "GRANT_REVOKED"
	// CodeGrantExpired: the grant that approved a call expired before the
	// call ran; the call does not run.
	CodeGrantExpired Code = "GRANT_EXPIRED"
	// CodeGrantInvalid: a grant record does not verify (its MAC or its
	// TurnContext's seal does not match: forged or edited in storage), or
	// does not cover the call it is said to have decided. It decides
	// nothing.
	CodeGrantInvalid Code = "GRANT_INVALID"
	// CodeGrantNotFound: a revocation names a grant that does not exist
	// (or that the person may not see).
	CodeGrantNotFound Code = "GRANT_NOT_FOUND"

	// Policy and tools.
	CodePolicyDenied       Code = "POLICY_DENIED"
	CodeApprovalDenied     Code = "APPROVAL_DENIED"
	CodeToolNotFound       Code = "TOOL_NOT_FOUND"
	CodeToolFailed         Code = "TOOL_FAILED"
	CodeExecutionUncertain Code = "EXECUTION_UNCERTAIN"
	// CodeArgsInvalid: the arguments do not match the tool's JSON Schema;
	// the reason names the schema path. Found before anyone is asked.
	CodeArgsInvalid Code = "ARGS_INVALID"
	// CodeToolUnavailable: the tool certainly did not run (no tool service
	// answered, its MCP server was down before the call was sent).
	CodeToolUnavailable Code = "TOOL_UNAVAILABLE"
	// CodeToolReplyInvalid: a remote tool's reply could not be trusted as
	// the answer to this call (another call's id, malformed, over the size
	// limit). The tool may have acted: the result needs attention.
	CodeToolReplyInvalid   Code = "TOOL_REPLY_INVALID"
	CodeBatchRecordMissing Code = "BATCH_RECORD_MISSING"
	CodeBatchStateInvalid  Code = "BATCH_STATE_INVALID"
	CodeHandlerPanic       Code = "HANDLER_PANIC"
	CodeRetriesExhausted   Code = "RETRIES_EXHAUSTED"
	CodeUnknownMessage     Code = "UNKNOWN_MESSAGE"

	// The planner (the agent loop).

	// CodeLLMUnavailable: the model endpoint could not be reached or kept
	// failing (after the client's retries with back-off on 429 and 5xx).
	CodeLLMUnavailable Code = "LLM_UNAVAILABLE"
	// CodeLLMBadResponse: the model endpoint answered with something that
	// is not a usable chat completion (not JSON, no choice, refused).
	CodeLLMBadResponse Code = "LLM_BAD_RESPONSE"
	// CodeBudgetExhausted: the agent loop ran out of steps, tokens or wall
	// time before the model answered with text.
	CodeBudgetExhausted Code = "BUDGET_EXHAUSTED"

	// Outgoing webhooks.

	// CodeWebhookUndeliverable: a webhook subscriber did not accept an event
	// (no 2xx answer) by the last attempt of its retry schedule, or answered
	// 410 Gone; the event is dead-lettered for that subscriber.
	CodeWebhookUndeliverable Code = "WEBHOOK_UNDELIVERABLE"

	// CodeChatUndeliverable: a chat platform refused a post or an update
	// for good (a channel gone, the app removed from it); the event is
	// dead-lettered for that chat transport.
	CodeChatUndeliverable Code = "CHAT_UNDELIVERABLE"
)

// Error is a failure with a stable Code. It is how every stage reports a
// reason to a user or to the dead-letter stream. errors.Is(err, &Error{Code: c})
// matches any *Error in the chain with the same code.
type Error struct {
	Code   Code
	Reason string
	Err    error
}

// Errorf returns an *Error with code c and a formatted reason. A %w verb in
// format is unwrapped like fmt.Errorf.
func Errorf(c Code, format string, args ...any) *Error {
	wrapped := fmt.Errorf(format, args...)
	return &Error{Code: c, Reason: wrapped.Error(), Err: errors.Unwrap(wrapped)}
}

func (e *Error) Error() string {
	if e.Reason == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Reason
}

func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// ReasonOf is err's message without its code: what a result or an outcome
// carries as its reason next to the code, so that the code is not said
// twice. An error with no code is its message.
func ReasonOf(err error) string {
	msg := err.Error()
	if c := CodeOf(err); c != "" {
		msg = strings.Replace(msg, string(c)+": ", "", 1)
	}
	return msg
}

// CodeOf returns the code of the first *Error in err's chain, or "" when err
// carries none (a transient or infrastructure error).
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Permanent reports whether err is permanent: trying the same thing again
// cannot change the answer, so the caller gives up on it (dead-letters the
// message, fails the call or the batch closed, refuses the request) instead
// of retrying. An error is permanent exactly when it carries a Code
// (CodeOf(err) != ""): a Code is Tollgate's verdict on the input itself (it
// does not decode, breaks a rule, is too large to store), and the same
// input gets the same verdict every time.
//
// Every other error is transient: a broker, KV or network failure, a
// timeout, a cancelled context, a lost compare-and-set race. Callers retry
// those, with a bound. A failure that is permanent but does not come from
// Tollgate's own rules (a stream refusing a message as too large) is given
// a Code where it is detected (pipeline/bus), so that this one predicate
// sees it.
func Permanent(err error) bool { return CodeOf(err) != "" }
