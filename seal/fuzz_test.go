package seal_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// decodeContext decodes b into a TurnContext the way a careless reader of
// storage would (msgpack straight into the struct). ok is false when b is
// not a TurnContext; a decoder panic counts as not decodable (that is the
// decoder's contract, not Verify's; schemas.Decode guards against it).
func decodeContext(b []byte) (tc *schemas.TurnContext, ok bool) {
	defer func() {
		if recover() != nil {
			tc, ok = nil, false
		}
	}()
	var c schemas.TurnContext
	if err := msgpack.Unmarshal(b, &c); err != nil {
		return nil, false
	}
	return &c, true
}

// FuzzVerify mutates the msgpack encoding of a sealed context. Verify must
// never panic, must answer with a reason code whenever it refuses, and may
// accept only a context whose sealed bytes, key id and MAC are exactly the
// original's: no mutation of authority verifies.
func FuzzVerify(f *testing.F) {
	r := twoKeyRing(f)
	orig := sealed(f, r, newContext())
	origBody, err := schemas.SealedBytes(orig)
	if err != nil {
		f.Fatal(err)
	}
	origMAC := bytes.Clone(orig.Seal.MAC)

	seed := func(tc *schemas.TurnContext) {
		b, err := msgpack.Marshal(tc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(orig)
	noThread := cloneContext(orig)
	noThread.Channel.Thread = ""
	seed(noThread)
	stripped := cloneContext(orig)
	stripped.Seal = nil
	seed(stripped)
	otherKey := cloneContext(orig)
	otherKey.Seal.KeyID = "k2"
	seed(otherKey)
	public := cloneContext(orig)
	public.Audience = schemas.AudiencePublic
	seed(public)
	// The original inside an accepted turn: a different framing to mutate.
	if b, err := schemas.Encode(&schemas.AcceptedTurn{TurnID: orig.TurnID, Context: cloneContext(orig)}); err == nil {
		f.Add(b)
	}

	known := map[schemas.Code]bool{
		schemas.CodeTurnContextMissing:       true,
		schemas.CodeSchemaVersionUnsupported: true,
		schemas.CodeTurnContextInvalid:       true,
		schemas.CodeTurnContextTampered:      true,
		schemas.CodeSealKeyUnknown:           true,
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 64<<10 {
			return
		}
		tc, ok := decodeContext(b)
		if !ok {
			return
		}
		err := r.Verify(tc)
		if err != nil {
			if code := schemas.CodeOf(err); !known[code] {
				t.Fatalf("Verify refused with code %q (%v), want a TurnContext reason code", code, err)
			}
			return
		}
		body, err := schemas.SealedBytes(tc)
		if err != nil {
			t.Fatalf("Verify accepted a context SealedBytes cannot encode: %v", err)
		}
		if !bytes.Equal(body, origBody) {
			t.Fatalf("Verify accepted a context whose authority differs from the sealed one:\n got %+v", tc)
		}
		if tc.Seal == nil || tc.Seal.KeyID != orig.Seal.KeyID || !bytes.Equal(tc.Seal.MAC, origMAC) {
			t.Fatalf("Verify accepted a seal that is not the original: %+v", tc.Seal)
		}
	})
}

// FuzzParse feeds arbitrary bytes to the key file parser. It must never
// panic; when it accepts, the ring must seal and verify, list its current
// key, and refuse a context sealed under another ring's key of the same id.
func FuzzParse(f *testing.F) {
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	f.Add([]byte(fmt.Sprintf(`{"current":"k1","keys":{"k1":%q}}`, b64(k1Bytes))))
	f.Add([]byte(fmt.Sprintf(`{"current":"k2","keys":{"k1":%q,"k2":%q}}`, b64(k1Bytes), b64(k2Bytes))))
	f.Add([]byte(fmt.Sprintf("{\n  \"current\": \"dev_key-1\",\n  \"keys\": {\n    \"dev_key-1\": %q\n  }\n}\n", b64(k3Bytes))))
	f.Add([]byte(`{"current":"k1","keys":{"k1":"c2hvcnQ="}}`))
	f.Add([]byte(`{"current":"k1","keys":{}}`))
	f.Add([]byte(`{"current":"k1","keys":{"k1":"!!"},"x":1}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))

	// A context sealed by a ring whose every plausible id maps to a key no
	// parsed file can hold by accident (it is fixed and distinct from seeds).
	foreignKey := bytes.Repeat([]byte{0x5a}, seal.MinKeyBytes)

	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := seal.Parse(b)
		if err != nil {
			if r != nil {
				t.Fatal("Parse returned a ring and an error")
			}
			return
		}
		ids := r.IDs()
		if len(ids) == 0 {
			t.Fatal("Parse accepted a ring with no keys")
		}
		found := false
		for _, id := range ids {
			found = found || id == r.Current()
		}
		if !found {
			t.Fatalf("current %q is not among %v", r.Current(), ids)
		}
		tc := newContext()
		if err := r.Seal(tc); err != nil {
			t.Fatalf("an accepted ring cannot seal: %v", err)
		}
		if tc.Seal.KeyID != r.Current() {
			t.Fatalf("sealed with %q, want current %q", tc.Seal.KeyID, r.Current())
		}
		if err := r.Verify(tc); err != nil {
			t.Fatalf("an accepted ring does not verify its own seal: %v", err)
		}
		tampered := cloneContext(tc)
		tampered.Audience = schemas.AudiencePublic
		if code := schemas.CodeOf(r.Verify(tampered)); code != schemas.CodeTurnContextTampered {
			t.Fatalf("an edited context gave %q, want TURN_CONTEXT_TAMPERED", code)
		}
		foreign, err := seal.New(r.Current(), map[string][]byte{r.Current(): foreignKey})
		if err != nil {
			t.Fatalf("the current id %q is not a valid id: %v", r.Current(), err)
		}
		ft := sealed(t, foreign, newContext())
		if err := r.Verify(ft); err == nil {
			if err := foreign.Verify(tc); err == nil {
				return // the parsed file really holds foreignKey under this id
			}
			t.Fatal("a context sealed under another key of the same id verified")
		}
	})
}
