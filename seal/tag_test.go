package seal_test

import (
	"bytes"
	"testing"

	"github.com/tollgate-dev/tollgate/seal"
)

// TestTagIsBoundToItsDomainKeyAndMessage: a tag verifies for its own
// domain, key and message only, with any key of the ring after a
// rotation, and never with a key the ring does not hold.
func TestTagIsBoundToItsDomainKeyAndMessage(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, seal.MinKeyBytes), bytes.Repeat([]byte{2}, seal.MinKeyBytes)
	old, err := seal.New("k1", map[string][]byte{"k1": k1})
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := seal.New("k2", map[string][]byte{"k1": k1, "k2": k2})
	if err != nil {
		t.Fatal(err)
	}
	other, err := seal.New("k1", map[string][]byte{"k1": k2})
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte(`{"c":"token"}`)
	id, tag := old.Tag("web.signin", msg)
	for _, tc := range []struct {
		name   string
		ring   *seal.KeyRing
		domain string
		keyID  string
		msg    []byte
		tag    []byte
		want   bool
	}{
		{"the same ring, domain and message", old, "web.signin", id, msg, tag, true},
		{"a ring rotated since, which still lists the key", rotated, "web.signin", id, msg, tag, true},
		{"another domain", old, "web.other", id, msg, tag, false},
		{"an edited message", old, "web.signin", id, []byte(`{"c":"tokem"}`), tag, false},
		{"a key id the ring does not hold", old, "web.signin", "k9", msg, tag, false},
		{"another key under the same id", other, "web.signin", id, msg, tag, false},
		{"a truncated tag", old, "web.signin", id, msg, tag[:16], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.ring.CheckTag(tc.domain, tc.keyID, tc.msg, tc.tag); got != tc.want {
				t.Fatalf("CheckTag: %v, want %v", got, tc.want)
			}
		})
	}
	if id2, _ := rotated.Tag("web.signin", msg); id2 != "k2" {
		t.Fatalf("a rotated ring tags with %q, want its current key k2", id2)
	}
}
