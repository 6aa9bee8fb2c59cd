package chat

// Refusal reasons, the reason label of tollgate_<name>_refused_total. A
// refusal publishes nothing.
const (
	ReasonBadSignature   = "bad_signature"   // missing or wrong signature: 401
	ReasonStaleTimestamp = "stale_timestamp" // signed timestamp outside SignatureWindow: 401
	ReasonReplayed       = "replayed"        // the same signed request again: 400
	ReasonDuplicate      = "duplicate"       // an event id or action seen before (the platform's retry): 200, no work (Slack)
	ReasonMalformed      = "malformed"       // not a payload Tollgate reads: 400
	ReasonUnknownAction  = "unknown_action"  // an action, command or view Tollgate never sent: 400
	ReasonActionMismatch = "action_mismatch" // the button does not belong to the approval it names, or the digest differs: 400
	ReasonNotPending     = "not_pending"     // a click on a decided or expired approval: a notice to the clicker alone, nothing published
	ReasonBotMessage     = "bot_message"     // a message or command by a bot (Tollgate's own too): not a turn
	ReasonIgnored        = "ignored"         // an event that is not a turn (edits, other subtypes, unknown threads) (Slack)
	ReasonNowhere        = "nowhere"         // an outcome or reply with no deliverable target
)
