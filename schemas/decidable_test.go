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
