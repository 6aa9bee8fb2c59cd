package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Identifiers are derived, not random, wherever a redelivery must land on the
// same record: the same inbound message always yields the same turn id, and
// a turn's calls and approvals are numbered by their index in the batch. All
// ids are valid KV keys and NATS subject tokens.

const turnHashLen = 20 // hex chars: 80 bits

func hashHex(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TurnID is the id of the turn accepted from the inbound message
// (transport, messageID): "t-" followed by 20 hex characters.
func TurnID(transport, messageID string) string {
	return "t-" + hashHex("turn", transport, messageID)[:turnHashLen]
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

// SessionKey is the KV key of a session: a hash, since transport session ids
// may hold characters that are not valid in a key.
func SessionKey(sessionID string) string {
	return "s-" + hashHex("session", sessionID)[:32]
}

// Principal is the identity of a sender on a transport: "transport:sender".
func Principal(transport, senderID string) string {
	return transport + ":" + senderID
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
