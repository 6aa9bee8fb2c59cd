package schemas_test

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Decidable is the one still-decidable rule: pending and not past its
// expiry (an expiry at now has passed); expired when expired or pending
// past its expiry; already decided for any other status.
func TestDecidable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		status  schemas.ApprovalStatus
		expires time.Time
		want    schemas.Code
	}{
		{schemas.ApprovalPending, time.Time{}, ""},
		{schemas.ApprovalPending, now.Add(time.Second), ""},
		{schemas.ApprovalPending, now, schemas.CodeApprovalExpired},
		{schemas.ApprovalPending, now.Add(-time.Second), schemas.CodeApprovalExpired},
		{schemas.ApprovalExpired, now.Add(time.Hour), schemas.CodeApprovalExpired},
		{schemas.ApprovalApproved, time.Time{}, schemas.CodeApprovalAlreadyDecided},
		{schemas.ApprovalDenied, now.Add(-time.Hour), schemas.CodeApprovalAlreadyDecided},
		{schemas.ApprovalAbandoned, time.Time{}, schemas.CodeApprovalAlreadyDecided},
	} {
		rec := &schemas.ApprovalRecord{ApprovalID: "a-1-0", Status: c.status, ExpiresAt: c.expires}
		err := rec.Decidable(now)
		if got := schemas.CodeOf(err); got != c.want || (c.want == "") != (err == nil) {
			t.Errorf("%s expiring %v: %v, want %q", c.status, c.expires, err, c.want)
		}
	}
}

// Holds and Names are the one rule of whether an answer is a decision's
// own: its decision or a counted vote, never another decision's, never
// for an empty id.
func TestAnAnswerNamesOnlyItsOwnDecision(t *testing.T) {
	rec := &schemas.ApprovalRecord{
		Decision: &schemas.DecisionInfo{DecisionID: "d-winner", Option: schemas.OptionDeny},
		Votes:    []schemas.DecisionInfo{{DecisionID: "d-vote", Option: schemas.OptionApprove}},
	}
	ev := &schemas.DecidedEvent{Decision: rec.Decision, Votes: rec.Votes}
	for _, tc := range []struct {
		name, id string
		want     bool
	}{
		{"the decision taken", "d-winner", true},
		{"a counted quorum vote", "d-vote", true},
		{"a decision that lost the race", "d-loser", false},
		{"no decision id", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rec.Holds(tc.id); got != tc.want {
				t.Errorf("record holds %q: %v, want %v", tc.id, got, tc.want)
			}
			if got := ev.Names(tc.id); got != tc.want {
				t.Errorf("decided event names %q: %v, want %v", tc.id, got, tc.want)
			}
			if d := rec.DecisionOf(tc.id); (d != nil) != tc.want || d != nil && d.DecisionID != tc.id {
				t.Errorf("DecisionOf(%q) = %+v", tc.id, d)
			}
		})
	}
	if (&schemas.ApprovalRecord{}).Holds("d-winner") {
		t.Error("a pending record without votes holds a decision")
	}
}

// A decided event answers a decision that it names, or that repeats the
// decision or a counted vote it holds (the same principal, the same
// option: an idempotent success the approver announces again under the
// first decision's id); never a decision of someone else or of another
// option, which the approver judges on its own.
func TestADecidedEventAnswersItsDecisionAndItsIdenticalRepeats(t *testing.T) {
	ev := &schemas.DecidedEvent{
		ApprovalID: "a-1", Status: schemas.ApprovalApproved,
		Decision: &schemas.DecisionInfo{DecisionID: "d-first", Principal: "cli:alice", Option: schemas.OptionApprove},
		Votes:    []schemas.DecisionInfo{{DecisionID: "d-vote", Principal: "slack:bob", Option: schemas.OptionApprove}},
	}
	decision := func(id, approval, transport, decider, option string) *schemas.Decision {
		return &schemas.Decision{DecisionID: id, ApprovalID: approval, Transport: transport, Decider: schemas.Sender{ID: decider}, Option: option}
	}
	for _, tc := range []struct {
		name string
		d    *schemas.Decision
		want bool
	}{
		{"the decision it names", decision("d-first", "a-1", "cli", "alice", schemas.OptionApprove), true},
		{"a repeat of that decision under a new id", decision("d-again", "a-1", "cli", "alice", schemas.OptionApprove), true},
		{"a repeat of a counted vote", decision("d-vote-again", "a-1", "slack", "bob", schemas.OptionApprove), true},
		{"the same person's other option", decision("d-deny", "a-1", "cli", "alice", schemas.OptionDeny), false},
		{"someone else's decision of the same outcome", decision("d-mallory", "a-1", "cli", "mallory", schemas.OptionApprove), false},
		{"the same name on another transport", decision("d-web", "a-1", "web", "alice", schemas.OptionApprove), false},
		{"a decision of another approval", decision("d-first", "a-2", "cli", "alice", schemas.OptionApprove), false},
		{"no decision", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ev.Answers(tc.d); got != tc.want {
				t.Errorf("Answers(%+v) = %v, want %v", tc.d, got, tc.want)
			}
		})
	}
	// Announced again for someone else's repeat of the outcome: the
	// announcement answers that repeat, and no other decision.
	again := *ev
	again.Repeat = "d-mallory"
	if !again.Answers(decision("d-mallory", "a-1", "cli", "mallory", schemas.OptionApprove)) {
		t.Error("an announcement made again for a repeat does not answer it")
	}
	if again.Answers(decision("d-other", "a-1", "cli", "mallory", schemas.OptionApprove)) || again.Answers(decision("d-mallory", "a-2", "cli", "mallory", schemas.OptionApprove)) {
		t.Error("an announcement made again for one repeat answers another decision")
	}
}
