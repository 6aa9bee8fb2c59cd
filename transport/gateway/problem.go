package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

// Reason codes of the HTTP API. They complete the pipeline's codes
// (schemas.Code..., docs/protocol.md §7), which the API also returns.
const (
	CodeUnauthenticated      schemas.Code = "UNAUTHENTICATED"            // no key, or a key that is unknown or does not match
	CodeKeyExpired           schemas.Code = "KEY_EXPIRED"                // the key is past its not_after
	CodeScopeMissing         schemas.Code = "SCOPE_MISSING"              // the key may not do this (submit, read, decide)
	CodeRateLimited          schemas.Code = "RATE_LIMITED"               // the key's request rate is exceeded
	CodeTooManyStreams                    = eventfeed.CodeTooManyStreams // the key holds its cap of event streams open
	CodeIdempotencyKeyReused schemas.Code = "IDEMPOTENCY_KEY_REUSED"     // same Idempotency-Key, different request
	CodeTurnNotFound         schemas.Code = "TURN_NOT_FOUND"             // no such turn for this key's transport
	CodeNotFound             schemas.Code = "NOT_FOUND"                  // no such route
	CodeMethodNotAllowed     schemas.Code = "METHOD_NOT_ALLOWED"
	CodeUnavailable          schemas.Code = "UNAVAILABLE"      // the bus did not answer
	CodeSessionReserved      schemas.Code = "SESSION_RESERVED" // the session is another API key's MCP or hook session
	CodeSenderReserved       schemas.Code = "SENDER_RESERVED"  // the sender id is another API key's id
)

// Problem is an RFC 9457 problem detail, with Tollgate's reason code.
type Problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Code   schemas.Code `json:"code"`
	Detail string       `json:"detail,omitempty"`
}

// problemType is the type URI of every problem: the table of codes in
// docs/api.md. The code itself is in the code member.
const problemType = "https://github.com/tollgate-dev/tollgate/blob/main/docs/api.md#errors"

// writeProblem writes an application/problem+json response.
func writeProblem(w http.ResponseWriter, status int, code schemas.Code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{
		Type: problemType, Title: http.StatusText(status), Status: status, Code: code, Detail: detail,
	})
}

// writeJSON writes v as an application/json response, with its
// Content-Length: the body is encoded into a pooled buffer first, so that
// the response goes out in one write rather than chunked.
func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := jsonBufs.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxPooledJSON {
			buf.Reset()
			jsonBufs.Put(buf)
		}
	}()
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		writeProblem(w, http.StatusInternalServerError, CodeUnavailable, "encode the response: "+err.Error())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// jsonBufs pools writeJSON's buffers; one grown past maxPooledJSON (a
// long approvals list) is left to the collector.
var jsonBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledJSON = 64 << 10
