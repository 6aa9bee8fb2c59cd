package schemas

import "time"

// VotedEventVersion is the current VotedEvent version.
const VotedEventVersion = 1

// VotedEvent is published on tollgate.event.approval.voted.<turn id> when
// the approver counts a quorum vote that leaves the approval pending (more
// approvals are needed): who voted, and every vote so far. The vote that
// completes the quorum is announced by the approval's DecidedEvent
// instead. It is a notice for the people watching (the web inbox shows the
// votes live); the record in KV stays what decides.
type VotedEvent struct {
	V          Version      `msgpack:"v"`
	ApprovalID string       `msgpack:"approval_id"`
	TurnID     string       `msgpack:"turn_id"`
	SessionID  string       `msgpack:"session_id"`
	Vote       DecisionInfo `msgpack:"vote"`
	// Votes are the record's votes after this one, oldest first.
	Votes []DecisionInfo `msgpack:"votes"`
	// Quorum is the number of distinct approvals the approval needs.
	Quorum int       `msgpack:"quorum"`
	At     time.Time `msgpack:"at"`
}

func (e *VotedEvent) schemaVersion() Version  { return e.V }
func (e *VotedEvent) currentVersion() Version { return VotedEventVersion }
func (e *VotedEvent) stampVersion()           { e.V = VotedEventVersion }

func (e *VotedEvent) validate() error {
	return firstErr(
		checkString("approval_id", e.ApprovalID, MaxIDBytes, true, false),
		checkString("turn_id", e.TurnID, MaxIDBytes, true, false),
		checkString("vote.principal", e.Vote.Principal, MaxIDBytes, true, false),
	)
}
