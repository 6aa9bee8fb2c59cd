package schemas_test

import (
	"bytes"
	"encoding/hex"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// TestGrantOfferForIsInItsSmallestForm: an approval's grant offer writes
// for (nanoseconds) in the smallest integer form (docs/protocol.md §2.1),
// and an approval written with for as an int64 (0xd3, as before) decodes
// to the same offer.
func TestGrantOfferForIsInItsSmallestForm(t *testing.T) {
	forKey := []byte("\xa3for")
	for _, tc := range []struct {
		d    time.Duration
		want string // hex of the value after the key
	}{
		{0, "00"},
		{127, "7f"},
		{200, "ccc8"},
		{time.Millisecond, "ce000f4240"},
		{24 * time.Hour, "cf00004e94914f0000"},
	} {
		a := exampleApproval()
		a.Grants[0].For = tc.d
		b, err := schemas.Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(b, forKey)
		if i < 0 {
			t.Fatal("no for key in the encoding")
		}
		val := b[i+len(forKey):]
		if got := hex.EncodeToString(val[:len(tc.want)/2]); got != tc.want {
			t.Errorf("for %v is written %s…, want %s", tc.d, hex.EncodeToString(val[:min(9, len(val))]), tc.want)
		}
		// The same record as the previous version wrote it: int64.
		old := append(append(bytes.Clone(b[:i+len(forKey)]), 0xd3, 0, 0, 0, 0, 0, 0, 0, 0), val[len(tc.want)/2:]...)
		for k := range 8 {
			old[i+len(forKey)+1+k] = byte(uint64(tc.d) >> (56 - 8*k))
		}
		got, err := schemas.Decode[schemas.ApprovalRecord](old)
		if err != nil {
			t.Fatalf("for %v written as int64: %v", tc.d, err)
		}
		if got.Grants[0].For != tc.d || got.Grants[0].Summary != a.Grants[0].Summary {
			t.Errorf("for written as int64 decodes to %v, want %v", got.Grants[0].For, tc.d)
		}
	}
}
