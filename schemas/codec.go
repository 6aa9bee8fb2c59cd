package schemas

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// MaxPayloadBytes bounds every encoded record and message Tollgate decodes.
// It matches nats-server's default max_payload (1 MiB).
const MaxPayloadBytes = 1 << 20

// Record is implemented by every versioned wire and storage type.
type Record interface {
	schemaVersion() Version
	currentVersion() Version
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
	// Maps (an approval's trace context) encode in key order, so that a
	// record has one encoding (golden vectors, equal records equal bytes).
	enc.SetSortMapKeys(true)
	return &encoder{buf: buf, enc: enc}
}}

type encoder struct {
	buf *bytes.Buffer
	enc *msgpack.Encoder
}

// Encode stamps r with its type's current schema version and returns its
// msgpack encoding. It fails if r does not pass its own validation, or with
// CodePayloadTooLarge if the encoding exceeds MaxPayloadBytes (so a record
// that could never be stored fails permanently rather than as a retryable
// broker error).
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
	if e.buf.Len() > MaxPayloadBytes {
		return nil, Errorf(CodePayloadTooLarge, "encoded %T is %d bytes, limit %d", r, e.buf.Len(), MaxPayloadBytes)
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
	if err := checkShape(b); err != nil {
		return nil, &Error{Code: CodeMalformed, Reason: fmt.Sprintf("decode %T: %v", (*T)(nil), err), Err: err}
	}
	v := new(T)
	if err := unmarshal(b, v); err != nil {
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

// maxDepth bounds how deeply maps and arrays may nest in a payload. Tollgate's
// own records nest three levels; the rest is room for unknown keys.
const maxDepth = 32

// checkShape walks the msgpack value in b without allocating and rejects
// what must never reach the msgpack decoder:
//
//   - a top level that is not a map (records are maps with named keys; the
//     decoder would otherwise accept a positional array);
//   - a length that claims more elements or bytes than the payload holds: the
//     decoder allocates a slice by its claimed length before reading it, so a
//     15-byte payload claiming 2^32 calls would make a worker allocate
//     hundreds of gigabytes and die;
//   - nesting deeper than maxDepth (the decoder skips unknown values
//     recursively);
//   - bytes after the value: a payload is exactly one record.
func checkShape(b []byte) error {
	if len(b) == 0 || !(b[0] >= 0x80 && b[0] <= 0x8f || b[0] == 0xde || b[0] == 0xdf) {
		return errors.New("payload is not a msgpack map")
	}
	var stack [maxDepth + 1]uint64 // values still to read at each open level
	depth := 1
	stack[0] = 1
	i := 0
	// size reads a k-byte big-endian length at b[i:].
	size := func(k int) (uint64, bool) {
		if len(b)-i < k {
			return 0, false
		}
		var n uint64
		switch k {
		case 1:
			n = uint64(b[i])
		case 2:
			n = uint64(binary.BigEndian.Uint16(b[i:]))
		case 4:
			n = uint64(binary.BigEndian.Uint32(b[i:]))
		}
		i += k
		return n, true
	}
	for depth > 0 {
		if stack[depth-1] == 0 {
			depth--
			continue
		}
		stack[depth-1]--
		if i >= len(b) {
			return errors.New("unexpected end of payload")
		}
		c := b[i]
		i++
		var skip, children uint64 // payload bytes to skip; nested values to read
		ok := true
		switch {
		case c <= 0x7f || c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
		case c >= 0x80 && c <= 0x8f: // fixmap
			children = 2 * uint64(c&0x0f)
		case c >= 0x90 && c <= 0x9f: // fixarray
			children = uint64(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf: // fixstr
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, ok = size(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			skip, ok = size(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			skip, ok = size(4)
		case c == 0xc7: // ext8: length, type, data
			skip, ok = size(1)
			skip++
		case c == 0xc8: // ext16
			skip, ok = size(2)
			skip++
		case c == 0xc9: // ext32
			skip, ok = size(4)
			skip++
		case c == 0xca: // float32
			skip = 4
		case c == 0xcb: // float64
			skip = 8
		case c == 0xcc || c == 0xd0: // uint8, int8
			skip = 1
		case c == 0xcd || c == 0xd1: // uint16, int16
			skip = 2
		case c == 0xce || c == 0xd2: // uint32, int32
			skip = 4
		case c == 0xcf || c == 0xd3: // uint64, int64
			skip = 8
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc: // array16
			children, ok = size(2)
		case c == 0xdd: // array32
			children, ok = size(4)
		case c == 0xde: // map16
			children, ok = size(2)
			children *= 2
		case c == 0xdf: // map32
			children, ok = size(4)
			children *= 2
		default: // 0xc1, never used
			return fmt.Errorf("invalid msgpack code 0x%02x at offset %d", c, i-1)
		}
		rest := uint64(len(b) - i)
		if !ok || skip > rest {
			return fmt.Errorf("value at offset %d runs past the end of the payload", i)
		}
		i += int(skip)
		if children > 0 {
			// Every value takes at least one byte.
			if children > rest {
				return fmt.Errorf("offset %d claims %d nested values, more than the payload holds", i, children)
			}
			if depth == len(stack) {
				return fmt.Errorf("nesting deeper than %d levels", maxDepth)
			}
			stack[depth] = children
			depth++
		}
	}
	if i != len(b) {
		return fmt.Errorf("%d trailing bytes after the record", len(b)-i)
	}
	return nil
}

// unmarshal is msgpack.Unmarshal that turns a decoder panic into an error:
// msgpack v5 panics on some type mismatches (a nil where a timestamp is
// expected), and a payload must never crash a worker.
func unmarshal(b []byte, v any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decoder panic: %v", p)
		}
	}()
	return msgpack.Unmarshal(b, v)
}
