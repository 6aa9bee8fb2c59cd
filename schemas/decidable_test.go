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
