package httpserve

import (
	"net/http"

	"github.com/tollgate-dev/tollgate/schemas"
)

// RejectionStatus is the HTTP status of a decision the approver (or a
// surface's own check before publishing) refused with code c: 403 for a
// decider who may not decide, 404 for an approval that does not exist, 409
// for a decision that arrived too late or bound other arguments, and 422
// for every other refusal. It is the one table of reason code to status,
// used by the gateway's API and the web inbox alike (docs/api.md).
func RejectionStatus(c schemas.Code) int {
	switch c {
	case schemas.CodeDeciderNotAuthorized:
		return http.StatusForbidden
	case schemas.CodeApprovalNotFound:
		return http.StatusNotFound
	case schemas.CodeArgsDigestMismatch, schemas.CodeApprovalAlreadyDecided, schemas.CodeApprovalExpired:
		return http.StatusConflict
	}
	return http.StatusUnprocessableEntity
}
