package schemas

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// CanonicalArgs parses a tool call's JSON arguments and returns them in
// canonical form (object keys sorted, no insignificant white space, numbers
// kept as written) with their digest "sha256:<hex>". The arguments must be a
// single JSON object; "" is taken as {}. It fails with CodeArgsInvalidJSON.
//
// The digest is what an approval binds: a decision may carry it, and a call
// whose canonical arguments differ has a different digest.
func CanonicalArgs(raw string) (canonical, digest string, err error) {
	if len(raw) > MaxArgsBytes {
		return "", "", Errorf(CodePayloadTooLarge, "args are %d bytes, limit %d", len(raw), MaxArgsBytes)
	}
	if raw == "" {
		raw = "{}"
	}
	if !utf8.ValidString(raw) {
		return "", "", Errorf(CodeArgsInvalidJSON, "args are not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		return "", "", Errorf(CodeArgsInvalidJSON, "args: %v", err)
	}
	if v == nil {
		return "", "", Errorf(CodeArgsInvalidJSON, "args must be a JSON object, got null")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", "", Errorf(CodeArgsInvalidJSON, "args: trailing data after the JSON object")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", "", Errorf(CodeArgsInvalidJSON, "args: %v", err)
	}
	canonical = string(bytes.TrimRight(buf.Bytes(), "\n"))
	if len(canonical) > MaxArgsBytes {
		// Escaping can lengthen a string (U+2028 becomes \u2028).
		return "", "", Errorf(CodePayloadTooLarge, "canonical args are %d bytes, limit %d", len(canonical), MaxArgsBytes)
	}
	return canonical, ArgsDigest(canonical), nil
}

// ArgsDigest is the digest of canonical arguments: "sha256:<hex>".
func ArgsDigest(canonical string) string {
	sum := sha256.Sum256([]byte(canonical))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ContextDigest is a digest of c's canonical msgpack encoding. Two contexts
// with the same digest grant the same authority. A nil context has digest "".
func ContextDigest(c *TurnContext) string {
	if c == nil {
		return ""
	}
	b, err := msgpack.Marshal(c)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// SealedBytes is the canonical encoding a TurnContext's seal covers: the
// msgpack encoding of c with Seal unset. Struct fields encode in declaration
// order and times as Unix seconds and nanoseconds, so a decoded context
// re-encodes to the same bytes; a field this version does not know is
// dropped on decode, so a context carrying one never verifies (fail closed).
func SealedBytes(c *TurnContext) ([]byte, error) {
	var b bytes.Buffer
	if err := WriteSealed(&b, c); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteSealed writes SealedBytes(c) to w, encoding with a pooled encoder
// (no copy of the bytes is allocated): the one encoding of what a seal
// covers. An error is the encoder's or w's.
func WriteSealed(w io.Writer, c *TurnContext) error {
	cp := *c
	cp.Seal = nil
	e := encPool.Get().(*encoder)
	defer encPool.Put(e)
	e.buf.Reset()
	if err := e.enc.Encode(&cp); err != nil {
		return err
	}
	_, err := w.Write(e.buf.Bytes())
	return err
}
