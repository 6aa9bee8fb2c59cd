package chat

import (
	"io"
	"net/http"
	"strconv"
	"time"
)

// Limits of a platform's signed requests.
const (
	// SignatureWindow is how far a request's signed timestamp may be from
	// the clock, either way.
	SignatureWindow = 5 * time.Minute
	// AnswerBudget bounds the work done before a request is answered:
	// Slack and Discord want an answer within 3 seconds.
	AnswerBudget = 2500 * time.Millisecond
	// MaxBody is the largest request body read.
	MaxBody = 1 << 20
)

// ReadSigned reads r's body (at most MaxBody, else 400 malformed) and
// authenticates it: signed reports the request's signed timestamp (Unix
// seconds, as sent) and whether its signature over the body verifies
// (else 401 bad_signature); the timestamp must be within SignatureWindow
// of the clock (else 401 stale_timestamp). On success status is 0. Each
// refusal is counted.
func (t *Transport[M]) ReadSigned(r *http.Request, signed func(body []byte) (ts string, ok bool)) (body []byte, status int, reason string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil || len(body) > MaxBody {
		return nil, http.StatusBadRequest, t.Refuse(ReasonMalformed)
	}
	ts, ok := signed(body)
	if !ok {
		return nil, http.StatusUnauthorized, t.Refuse(ReasonBadSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, http.StatusUnauthorized, t.Refuse(ReasonStaleTimestamp)
	}
	if d := t.Now().Sub(time.Unix(sec, 0)); d > SignatureWindow || d < -SignatureWindow {
		return nil, http.StatusUnauthorized, t.Refuse(ReasonStaleTimestamp)
	}
	return body, 0, ""
}
