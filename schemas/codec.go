package schemas

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// MaxPayloadBytes bounds every encoded record and message Tollgate decodes.
// It matches nats-server's default max_payload (1 MiB).
const MaxPayloadBytes = 1 << 20

// Record is implemented by every versioned wire and storage type.
type Record interface {
	schemaVersion() uint16
	currentVersion() uint16
	stampVersion()
	validate() error
}

// Ptr constrains a type parameter to a pointer to a Record type, so that
// Decode[T] can allocate a T.
type Ptr[T any] interface {
	*T
	Record
}

var encPool = sync.Pool{New: func() any {
	buf := new(bytes.Buffer)
	enc := msgpack.NewEncoder(buf)
	return &encoder{buf: buf, enc: enc}
}}

type encoder struct {
	buf *bytes.Buffer
	enc *msgpack.Encoder
}

// Encode stamps r with its type's current schema version and returns its
// msgpack encoding. It fails only if r does not pass its own validation.
func Encode(r Record) ([]byte, error) {
	r.stampVersion()
	if err := r.validate(); err != nil {
		return nil, err
	}
	e := encPool.Get().(*encoder)
	defer encPool.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(r); err != nil {
		return nil, fmt.Errorf("encode %T: %w", r, err)
	}
	out := make([]byte, e.buf.Len())
	copy(out, e.buf.Bytes())
	return out, nil
}

// Decode decodes b into a new T. It returns an *Error with code
// CodePayloadTooLarge, CodeMalformed (not msgpack, or not the shape of T),
// CodeSchemaVersionUnsupported (the "v" field is not T's current version) or
// CodeInvalidInput (a required field is missing or out of range).
func Decode[T any, P Ptr[T]](b []byte) (*T, error) {
	if len(b) > MaxPayloadBytes {
		return nil, Errorf(CodePayloadTooLarge, "%d bytes exceeds the %d byte limit", len(b), MaxPayloadBytes)
	}
	if len(b) == 0 {
		return nil, Errorf(CodeMalformed, "empty payload")
	}
	v := new(T)
	if err := msgpack.Unmarshal(b, v); err != nil {
		return nil, &Error{Code: CodeMalformed, Reason: fmt.Sprintf("decode %T: %v", v, err), Err: err}
	}
	p := P(v)
	if got, want := p.schemaVersion(), p.currentVersion(); got != want {
		return nil, Errorf(CodeSchemaVersionUnsupported, "%T version %d, want %d", v, got, want)
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return v, nil
}
