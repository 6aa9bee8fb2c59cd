package chat

import (
	"time"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Truncate cuts s to at most n bytes on a rune boundary; cut reports
// whether it did.
func Truncate(s string, n int) (_ string, cut bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// Fold is Truncate to n bytes with " …" after a cut.
func Fold(s string, n int) string {
	if s, cut := Truncate(s, n); cut {
		return s + " …"
	}
	return s
}

// StatusWord is an approval status as a prompt's heading shows it.
func StatusWord(s schemas.ApprovalStatus) string {
	switch s {
	case schemas.ApprovalApproved:
		return "Approved"
	case schemas.ApprovalDenied:
		return "Denied"
	case schemas.ApprovalExpired:
		return "Expired"
	case schemas.ApprovalAbandoned:
		return "Abandoned"
	}
	return string(s)
}

// Expiry is when an approval expires as a prompt shows it: RFC 3339 UTC,
// or "never".
func Expiry(rec *schemas.ApprovalRecord) string {
	if rec.ExpiresAt.IsZero() {
		return "never"
	}
	return rec.ExpiresAt.UTC().Format(time.RFC3339)
}

// Decided is who closed an approval and when, as a closed prompt shows
// it: d's principal ("tollgate" when none, as for an expiry by the
// approver) and d's time, else at; and d's note ("" for none).
func Decided(d *schemas.DecisionInfo, at time.Time) (who string, when time.Time, note string) {
	who, when = "tollgate", at
	if d != nil {
		if d.Principal != "" {
			who = d.Principal
		}
		if !d.DecidedAt.IsZero() {
			when = d.DecidedAt
		}
		note = d.Note
	}
	return who, when, note
}
