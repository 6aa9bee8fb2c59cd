package httpserve_test

import (
	"net/http"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/schemas"
)

// The statuses docs/api.md gives for a refused decision.
func TestRejectionStatus(t *testing.T) {
	for c, want := range map[schemas.Code]int{
		schemas.CodeDeciderNotAuthorized:   http.StatusForbidden,
		schemas.CodeApprovalNotFound:       http.StatusNotFound,
		schemas.CodeArgsDigestMismatch:     http.StatusConflict,
		schemas.CodeApprovalAlreadyDecided: http.StatusConflict,
		schemas.CodeApprovalExpired:        http.StatusConflict,
		schemas.CodeOptionNotOffered:       http.StatusUnprocessableEntity,
		schemas.CodeMalformed:              http.StatusUnprocessableEntity,
	} {
		if got := httpserve.RejectionStatus(c); got != want {
			t.Errorf("RejectionStatus(%s) = %d, want %d", c, got, want)
		}
	}
}
