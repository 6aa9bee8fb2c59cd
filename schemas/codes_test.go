package schemas_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
)

func TestErrorMatchesByCode(t *testing.T) {
	err := schemas.Errorf(schemas.CodeOptionNotOffered, "option %q was not offered", "maybe")
	wrapped := fmt.Errorf("approver: apply decision d-1: %w", fmt.Errorf("load a-1: %w", err))

	cases := []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"same code", err, &schemas.Error{Code: schemas.CodeOptionNotOffered}, true},
		{"same code through two wraps", wrapped, &schemas.Error{Code: schemas.CodeOptionNotOffered}, true},
		{"same code, different reason", err, schemas.Errorf(schemas.CodeOptionNotOffered, "other"), true},
		{"different code", err, &schemas.Error{Code: schemas.CodeApprovalExpired}, false},
		{"different code through wraps", wrapped, &schemas.Error{Code: schemas.CodeMalformed}, false},
		{"plain error target", err, errors.New(string(schemas.CodeOptionNotOffered)), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := errors.Is(tc.err, tc.target); got != tc.want {
				t.Errorf("errors.Is(%v, %v) = %v, want %v", tc.err, tc.target, got, tc.want)
			}
		})
	}
}

func TestCodeOf(t *testing.T) {
	inner := schemas.Errorf(schemas.CodeTurnContextInvalid, "bad")
	cases := []struct {
		name string
		err  error
		want schemas.Code
	}{
		{"nil", nil, ""},
		{"plain error", errors.New("connection refused"), ""},
		{"a code", schemas.Errorf(schemas.CodeMalformed, "x"), schemas.CodeMalformed},
		{"wrapped once", fmt.Errorf("stage: %w", inner), schemas.CodeTurnContextInvalid},
		{"wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", inner)), schemas.CodeTurnContextInvalid},
		{"joined with a plain error", errors.Join(io.EOF, inner), schemas.CodeTurnContextInvalid},
		{"the outermost code wins", &schemas.Error{Code: schemas.CodeTurnContextInvalid, Err: schemas.Errorf(schemas.CodeInvalidInput, "x")}, schemas.CodeTurnContextInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := schemas.CodeOf(tc.err); got != tc.want {
				t.Errorf("CodeOf(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

func TestErrorfKeepsTheCause(t *testing.T) {
	err := schemas.Errorf(schemas.CodeToolFailed, "tool email.send: %w", io.ErrUnexpectedEOF)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("%%w cause lost: %v", err)
	}
	if got, want := err.Error(), "TOOL_FAILED: tool email.send: unexpected EOF"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got := (&schemas.Error{Code: schemas.CodeHandlerPanic}).Error(); got != "HANDLER_PANIC" {
		t.Errorf("Error() without a reason = %q", got)
	}
	if errors.Unwrap(schemas.Errorf(schemas.CodeToolFailed, "no cause")) != nil {
		t.Errorf("an error without %%w has a cause")
	}
}

func TestDecodeErrorsAreSchemaErrors(t *testing.T) {
	_, err := schemas.Decode[schemas.Decision]([]byte{0xc1})
	var se *schemas.Error
	if !errors.As(err, &se) || se.Code != schemas.CodeMalformed {
		t.Fatalf("Decode error %v is not a *schemas.Error with MALFORMED_PAYLOAD", err)
	}
	if se.Reason == "" {
		t.Errorf("MALFORMED_PAYLOAD without a reason")
	}
}

func TestPermanent(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"a plain error", errors.New("connection refused"), false},
		{"a timeout", context.DeadlineExceeded, false},
		{"a wrapped transient error", fmt.Errorf("load batch: %w", io.ErrUnexpectedEOF), false},
		{"a code", schemas.Errorf(schemas.CodeMalformed, "not msgpack"), true},
		{"a code wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", schemas.Errorf(schemas.CodePayloadTooLarge, "x"))), true},
		{"a code joined with a transient error", errors.Join(io.EOF, schemas.Errorf(schemas.CodeFollowUpRejected, "x")), true},
		{"a code's text without the code", errors.New(string(schemas.CodeMalformed) + ": not msgpack"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := schemas.Permanent(tc.err); got != tc.want {
				t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestReasonOfDoesNotRepeatTheCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a coded error is its reason", schemas.Errorf(schemas.CodeToolNotFound, "no tool named %q", "x"), `no tool named "x"`},
		{"a wrapped coded error keeps the wrapping", fmt.Errorf("call c-1: %w", schemas.Errorf(schemas.CodeArgsInvalid, "at /a: want string")), "call c-1: at /a: want string"},
		{"an error with no code is its message", errors.New("connection reset"), "connection reset"},
		{"a code with no reason is the code", &schemas.Error{Code: schemas.CodeToolFailed}, "TOOL_FAILED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := schemas.ReasonOf(tc.err); got != tc.want {
				t.Fatalf("ReasonOf = %q, want %q", got, tc.want)
			}
		})
	}
}
