package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"sync/atomic"
)

// Identifiers are derived, not random, wherever a redelivery must land on the
// same record: the same inbound message always yields the same turn id, and
// a turn's calls and approvals are numbered by their index in the batch. All
// ids are valid KV keys and NATS subject tokens.

const turnHashLen = 20 // hex chars: 80 bits

// hashID is prefix followed by the first n (at most 64) hex characters
// of the SHA-256 of parts, each part followed by a NUL byte. Ids are made
// and checked on every record a stage decodes (checkSessionKey), so the
// hash input and its hex live on the stack: one allocation, the id.
func hashID(prefix string, n int, parts ...string) string {
	var in [256]byte
	b := in[:0]
	for _, p := range parts {
		b = append(b, p...)
		b = append(b, 0)
	}
	sum := sha256.Sum256(b)
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	var out [96]byte
	return string(append(append(out[:0], prefix...), hx[:n]...))
}

// TurnID is the id of the turn accepted from the inbound message
// (transport, messageID): "t-" followed by 20 hex characters.
func TurnID(transport, messageID string) string {
	return hashID("t-", turnHashLen, "turn", transport, messageID)
}

// CallID is the id of call index of turn turnID.
func CallID(turnID string, index int) string {
	return turnID + "-" + strconv.Itoa(index)
}

// ApprovalID is the id of the approval for call index of turn turnID:
// "a-" followed by the turn's hash and the index.
func ApprovalID(turnID string, index int) string {
	return "a-" + strings.TrimPrefix(turnID, "t-") + "-" + strconv.Itoa(index)
}

// TurnIDOfCall returns the turn id a call id was derived from (CallID), or
// "" if callID is not of CallID's form.
func TurnIDOfCall(callID string) string {
	i := strings.LastIndexByte(callID, '-')
	if i <= 0 || i == len(callID)-1 {
		return ""
	}
	for _, c := range callID[i+1:] {
		if c < '0' || c > '9' {
			return ""
		}
	}
	return callID[:i]
}

// TurnIDOfApproval returns the turn id an approval id was derived from, or ""
// if id is not of ApprovalID's form.
func TurnIDOfApproval(id string) string {
	rest, ok := strings.CutPrefix(id, "a-")
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return ""
	}
	return "t-" + rest[:i]
}

// SessionKey is the key of the session sessionID of transport: the KV key
// of its session record (tollgate_sessions), the token that ends its inbound,
// accepted and ready subjects, and the root of its planner conversation and
// loop queue keys. It hashes the transport with the id (transport session
// ids may hold characters that are not valid in a key), so a session belongs
// to one transport: a principal of another transport that sends the same
// session id gets another session, and cannot read, join, block or
// supersede this one (docs/security.md rule 12). The trust boundary is the
// transport's (policy "transports"), so it is scoped too; it is not hashed
// in, so that a policy change does not split a session's queue.
//
// Ingest computes it once and seals it into the TurnContext
// (TurnContext.SessionKey); every later stage reads it from there
// (SessionKeyOf), never from live transport state.
func SessionKey(transport, sessionID string) string {
	return hashID("s-", 32, "session/transport", transport, sessionID)
}

// LegacySessionKey is the key the previous version gave a session: a hash
// of the session id alone, shared by every transport. It is read only for
// the turns whose TurnContext was sealed by that version (no SessionKey
// field; see SessionKeyOf), so that their pending approvals and queued
// turns finish in the session record they were queued in. It is never
// given to a new turn.
func LegacySessionKey(sessionID string) string {
	return hashID("s-", 32, "session", sessionID)
}

// legacySessionKeys counts SessionKeyOf's answers for contexts sealed by
// the previous version (LegacySessionKeyUses).
var legacySessionKeys atomic.Uint64

// SessionKeyOf returns the session key of the turn tc is the context of:
// tc.SessionKey, sealed at ingest. A context sealed by the previous
// version has none; its turn stays in the session it was queued in, under
// LegacySessionKey(tc.SessionID). That is the one compatibility path of
// session keys; it is counted (LegacySessionKeyUses, exported as
// tollgate_legacy_session_keys_total). A nil context has no session: "".
func SessionKeyOf(tc *TurnContext) string {
	switch {
	case tc == nil:
		return ""
	case tc.SessionKey != "":
		return tc.SessionKey
	}
	legacySessionKeys.Add(1)
	return LegacySessionKey(tc.SessionID)
}

// LegacySessionKeyUses is how many times this process resolved a session
// key by the compatibility path of SessionKeyOf.
func LegacySessionKeyUses() uint64 { return legacySessionKeys.Load() }

// Principal is the identity of a sender on a transport: "transport:sender".
func Principal(transport, senderID string) string {
	return transport + ":" + senderID
}

// CheckTurnKey is nil when turnID can key a turn's records (ValidKey);
// otherwise an INVALID_INPUT error naming it, which a stage dead-letters.
// It is the one check every stage makes before a turn id from a message
// reaches a KV key or a subject.
func CheckTurnKey(turnID string) error {
	if !ValidKey(turnID) {
		return Errorf(CodeInvalidInput, "turn id %q is not a valid key", turnID)
	}
	return nil
}

// ValidKey reports whether s can be used as a KV key / subject token.
func ValidKey(s string) bool {
	if s == "" || len(s) > MaxIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// FollowUpTurnID is the id of the follow-up work scheduled by call
// originCallID (one follow-up per call): the call id with "-f" appended, so
// it extends the id of the turn whose TurnContext it inherits.
func FollowUpTurnID(originCallID string) string { return originCallID + "-f" }

// MaxFollowUpDepth bounds chains of follow-ups (a follow-up scheduling a
// follow-up...), so a tool cannot make a turn live forever. A turn's depth
// is carried explicitly (AcceptedTurn.FollowUpDepth), never counted from
// its id: a turn id's hash may itself contain "f".
const MaxFollowUpDepth = 4

// IsFollowUpOf reports whether turnID is follow-up work descending from the
// turn rootTurnID: rootTurnID "-<index>-f", repeated.
func IsFollowUpOf(turnID, rootTurnID string) bool {
	rest, ok := strings.CutPrefix(turnID, rootTurnID)
	if !ok || rest == "" {
		return false
	}
	for rest != "" {
		// each level is "-<digits>-f"
		if len(rest) < 4 || rest[0] != '-' {
			return false
		}
		i := 1
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 1 || !strings.HasPrefix(rest[i:], "-f") {
			return false
		}
		rest = rest[i+2:]
	}
	return true
}
