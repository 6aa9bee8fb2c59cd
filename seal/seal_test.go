package seal_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/seal"
)

// Fixed, distinct test keys: k1Bytes is 32 bytes of 0x11, and so on.
var (
	k1Bytes = bytes.Repeat([]byte{0x11}, seal.MinKeyBytes)
	k2Bytes = bytes.Repeat([]byte{0x22}, seal.MinKeyBytes)
	k3Bytes = bytes.Repeat([]byte{0x33}, seal.MinKeyBytes+8)
)

var (
	ctxReceived = time.Date(2026, 3, 14, 9, 26, 53, 589793238, time.UTC)
	ctxCreated  = ctxReceived.Add(1500 * time.Millisecond)
)

// newContext returns a complete, unsealed TurnContext that passes Check.
func newContext() *schemas.TurnContext {
	const transport, messageID, sender = "slack", "1710408413.000100", "U02ABCDEF"
	return &schemas.TurnContext{
		V:         schemas.TurnContextVersion,
		SessionID: "T024BE7LD/C0123ABC/1710408400.000050",
		TurnID:    schemas.TurnID(transport, messageID),
		Requester: schemas.Requester{
			Principal: schemas.Principal(transport, sender),
			SenderID:  sender,
			Display:   "Ada Lovelace",
			Kind:      schemas.SenderUser,
			Verified:  true,
		},
		Transport:     transport,
		Channel:       schemas.Channel{ID: "C0123ABC", Kind: schemas.ChannelPrivate, Thread: "1710408400.000050"},
		Audience:      schemas.AudienceTeam,
		TrustBoundary: "acme-corp",
		Interactive:   true,
		Provenance: schemas.Provenance{
			Transport:  transport,
			MessageID:  messageID,
			StreamSeq:  4242,
			ReceivedAt: ctxReceived,
			IngestedBy: "ingest-7f9c",
		},
		CreatedAt: ctxCreated,
	}
}

// cloneContext returns a deep copy of tc (its seal and MAC are not shared).
func cloneContext(tc *schemas.TurnContext) *schemas.TurnContext {
	cp := *tc
	if tc.Seal != nil {
		s := *tc.Seal
		s.MAC = slices.Clone(tc.Seal.MAC)
		cp.Seal = &s
	}
	return &cp
}

func mustRing(t testing.TB, current string, keys map[string][]byte) *seal.KeyRing {
	t.Helper()
	r, err := seal.New(current, keys)
	if err != nil {
		t.Fatalf("seal.New(%q): %v", current, err)
	}
	return r
}

// twoKeyRing seals with k1 and also verifies with k2.
func twoKeyRing(t testing.TB) *seal.KeyRing {
	t.Helper()
	return mustRing(t, "k1", map[string][]byte{"k1": k1Bytes, "k2": k2Bytes})
}

func sealed(t testing.TB, r *seal.KeyRing, tc *schemas.TurnContext) *schemas.TurnContext {
	t.Helper()
	if err := r.Seal(tc); err != nil {
		t.Fatalf("Seal: %v", err)
	}
	if tc.Seal == nil {
		t.Fatal("Seal returned nil but left the context unsealed")
	}
	return tc
}

func wantVerified(t *testing.T, r *seal.KeyRing, tc *schemas.TurnContext) {
	t.Helper()
	if err := r.Verify(tc); err != nil {
		t.Fatalf("Verify: %v, want nil", err)
	}
}

func wantCode(t *testing.T, err error, want schemas.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %s", want)
	}
	if got := schemas.CodeOf(err); got != want {
		t.Fatalf("got code %q (%v), want %s", got, err, want)
	}
}

// writeKeyFile writes content to a new file with the given mode in a temp dir.
func writeKeyFile(t *testing.T, content string, mode fs.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "seal-keys.json")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	// Chmod explicitly: WriteFile's mode is filtered by the umask.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func wantMode0600(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o600 {
		t.Fatalf("%s has mode %v, want -rw-------", path, got)
	}
}

func keyFileJSON(t *testing.T, current string, keys map[string][]byte) string {
	t.Helper()
	f := seal.File{Current: current, Keys: map[string]string{}}
	for id, k := range keys {
		f.Keys[id] = base64.StdEncoding.EncodeToString(k)
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSealThenVerify(t *testing.T) {
	r := twoKeyRing(t)
	tc := sealed(t, r, newContext())
	if tc.Seal.KeyID != "k1" {
		t.Errorf("sealed with key %q, want the current key k1", tc.Seal.KeyID)
	}
	if len(tc.Seal.MAC) != sha256.Size {
		t.Errorf("MAC is %d bytes, want %d", len(tc.Seal.MAC), sha256.Size)
	}
	wantVerified(t, r, tc)

	// Sealing changes nothing but the seal.
	unsealed := cloneContext(tc)
	unsealed.Seal = nil
	a, _ := schemas.SealedBytes(unsealed)
	b, _ := schemas.SealedBytes(newContext())
	if !bytes.Equal(a, b) {
		t.Error("Seal changed the context's other fields")
	}

	// Sealing again (same key, same fields) gives the same MAC.
	again := sealed(t, r, cloneContext(tc))
	if !bytes.Equal(again.Seal.MAC, tc.Seal.MAC) {
		t.Error("resealing an unchanged context gave a different MAC")
	}

	// Another ring with the same keys verifies it: workers share a key file.
	wantVerified(t, mustRing(t, "k2", map[string][]byte{"k1": k1Bytes, "k2": k2Bytes}), tc)
}

func TestSealRefusesAnUnusableContext(t *testing.T) {
	r := twoKeyRing(t)
	tests := []struct {
		name string
		tc   *schemas.TurnContext
		want schemas.Code
	}{
		{"a nil context", nil, schemas.CodeTurnContextMissing},
		{"a context of an unknown version", func() *schemas.TurnContext { c := newContext(); c.V = 9; return c }(), schemas.CodeSchemaVersionUnsupported},
		{"a context without a requester", func() *schemas.TurnContext { c := newContext(); c.Requester = schemas.Requester{}; return c }(), schemas.CodeTurnContextInvalid},
		{"a context without an audience", func() *schemas.TurnContext { c := newContext(); c.Audience = ""; return c }(), schemas.CodeTurnContextInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := r.Seal(tt.tc)
			wantCode(t, err, tt.want)
			if tt.tc != nil && tt.tc.Seal != nil {
				t.Error("a context that failed to seal carries a seal")
			}
		})
	}
}

func TestSealSurvivesMsgpackRoundTrips(t *testing.T) {
	r := twoKeyRing(t)
	east := time.FixedZone("UTC+5:30", 5*3600+1800)
	tests := []struct {
		name string
		edit func(*schemas.TurnContext)
	}{
		{"times in UTC", func(*schemas.TurnContext) {}},
		{"times in a fixed non-UTC zone", func(c *schemas.TurnContext) {
			c.CreatedAt = c.CreatedAt.In(east)
			c.Provenance.ReceivedAt = c.Provenance.ReceivedAt.In(east)
		}},
		{"times from the wall clock with a monotonic reading", func(c *schemas.TurnContext) {
			c.CreatedAt = time.Now()
			c.Provenance.ReceivedAt = time.Now()
		}},
		{"a zero receive time", func(c *schemas.TurnContext) { c.Provenance.ReceivedAt = time.Time{} }},
		{"times before 1970", func(c *schemas.TurnContext) {
			c.CreatedAt = time.Date(1969, 7, 20, 20, 17, 40, 123, time.UTC)
		}},
		{"no thread, no display, legacy restored", func(c *schemas.TurnContext) {
			c.Channel.Thread = ""
			c.Requester.Display = ""
			c.LegacyRestored = true
		}},
		{"an unverified bot in a public channel", func(c *schemas.TurnContext) {
			c.Requester.Kind = schemas.SenderBot
			c.Requester.Verified = false
			c.Channel.Kind = schemas.ChannelPublic
			c.Audience = schemas.AudiencePublic
			c.Interactive = false
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := newContext()
			tt.edit(tc)
			sealed(t, r, tc)

			t.Run("as the context of an accepted turn through schemas.Encode and Decode", func(t *testing.T) {
				b, err := schemas.Encode(&schemas.AcceptedTurn{TurnID: tc.TurnID, Context: cloneContext(tc), Text: "hi", AcceptedAt: ctxCreated})
				if err != nil {
					t.Fatalf("Encode: %v", err)
				}
				got, err := schemas.Decode[schemas.AcceptedTurn](b)
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if got.Context == nil {
					t.Fatal("the decoded turn has no context")
				}
				if !got.Context.CreatedAt.IsZero() && got.Context.CreatedAt.Location() != time.Local {
					t.Logf("note: created_at decoded in %v (the test assumed Local)", got.Context.CreatedAt.Location())
				}
				if !got.Context.CreatedAt.Equal(tc.CreatedAt) {
					t.Fatalf("created_at %v, want %v", got.Context.CreatedAt, tc.CreatedAt)
				}
				wantVerified(t, r, got.Context)
			})
			t.Run("the context alone through msgpack", func(t *testing.T) {
				b, err := msgpack.Marshal(tc)
				if err != nil {
					t.Fatal(err)
				}
				var got schemas.TurnContext
				if err := msgpack.Unmarshal(b, &got); err != nil {
					t.Fatal(err)
				}
				wantVerified(t, r, &got)
				// And once more: a context re-persisted by a later stage.
				b2, err := msgpack.Marshal(&got)
				if err != nil {
					t.Fatal(err)
				}
				var again schemas.TurnContext
				if err := msgpack.Unmarshal(b2, &again); err != nil {
					t.Fatal(err)
				}
				wantVerified(t, r, &again)
			})
		})
	}
}

func TestEveryAuthorityEditAfterSealingIsTampered(t *testing.T) {
	r := twoKeyRing(t)
	base := sealed(t, r, newContext())
	wantVerified(t, r, base)

	tests := []struct {
		name string
		edit func(*schemas.TurnContext)
	}{
		{"session changed", func(c *schemas.TurnContext) { c.SessionID = "T024BE7LD/C0OTHER/1" }},
		{"turn id changed", func(c *schemas.TurnContext) { c.TurnID = schemas.TurnID("slack", "other-message") }},
		{"requester principal swapped", func(c *schemas.TurnContext) { c.Requester.Principal = "slack:U-MALLORY" }},
		{"requester sender id swapped", func(c *schemas.TurnContext) { c.Requester.SenderID = "U-MALLORY" }},
		{"requester display changed", func(c *schemas.TurnContext) { c.Requester.Display = "Mallory" }},
		{"requester display removed", func(c *schemas.TurnContext) { c.Requester.Display = "" }},
		{"requester kind changed from user to service", func(c *schemas.TurnContext) { c.Requester.Kind = schemas.SenderService }},
		{"requester verified cleared", func(c *schemas.TurnContext) { c.Requester.Verified = false }},
		{"transport changed", func(c *schemas.TurnContext) { c.Transport = "discord" }},
		{"channel id changed", func(c *schemas.TurnContext) { c.Channel.ID = "C0OTHER" }},
		{"channel kind widened from private to public", func(c *schemas.TurnContext) { c.Channel.Kind = schemas.ChannelPublic }},
		{"channel kind narrowed from private to dm", func(c *schemas.TurnContext) { c.Channel.Kind = schemas.ChannelDM }},
		{"channel thread changed", func(c *schemas.TurnContext) { c.Channel.Thread = "1710408400.999999" }},
		{"channel thread removed", func(c *schemas.TurnContext) { c.Channel.Thread = "" }},
		{"audience widened from team to public", func(c *schemas.TurnContext) { c.Audience = schemas.AudiencePublic }},
		{"audience narrowed from team to personal", func(c *schemas.TurnContext) { c.Audience = schemas.AudiencePersonal }},
		{"trust boundary changed", func(c *schemas.TurnContext) { c.TrustBoundary = "evil-corp" }},
		{"interactive cleared", func(c *schemas.TurnContext) { c.Interactive = false }},
		{"provenance transport changed", func(c *schemas.TurnContext) { c.Provenance.Transport = "discord" }},
		{"provenance message id changed", func(c *schemas.TurnContext) { c.Provenance.MessageID = "1710408413.000200" }},
		{"provenance stream sequence changed", func(c *schemas.TurnContext) { c.Provenance.StreamSeq++ }},
		{"provenance receive time moved by a nanosecond", func(c *schemas.TurnContext) {
			c.Provenance.ReceivedAt = c.Provenance.ReceivedAt.Add(time.Nanosecond)
		}},
		{"provenance ingesting worker changed", func(c *schemas.TurnContext) { c.Provenance.IngestedBy = "ingest-0000" }},
		{"created at moved by a nanosecond", func(c *schemas.TurnContext) { c.CreatedAt = c.CreatedAt.Add(time.Nanosecond) }},
		{"created at moved by an hour", func(c *schemas.TurnContext) { c.CreatedAt = c.CreatedAt.Add(time.Hour) }},
		{"legacy restored set", func(c *schemas.TurnContext) { c.LegacyRestored = true }},
		{"one bit of the MAC flipped", func(c *schemas.TurnContext) { c.Seal.MAC[7] ^= 0x01 }},
		{"last bit of the MAC flipped", func(c *schemas.TurnContext) { c.Seal.MAC[len(c.Seal.MAC)-1] ^= 0x80 }},
		{"MAC truncated by one byte", func(c *schemas.TurnContext) { c.Seal.MAC = c.Seal.MAC[:len(c.Seal.MAC)-1] }},
		{"MAC truncated to 16 bytes", func(c *schemas.TurnContext) { c.Seal.MAC = c.Seal.MAC[:16] }},
		{"MAC emptied", func(c *schemas.TurnContext) { c.Seal.MAC = nil }},
		{"MAC extended by a byte", func(c *schemas.TurnContext) { c.Seal.MAC = append(c.Seal.MAC, 0) }},
		{"MAC all zeros", func(c *schemas.TurnContext) { c.Seal.MAC = make([]byte, sha256.Size) }},
		{"key id swapped to another key in the ring", func(c *schemas.TurnContext) { c.Seal.KeyID = "k2" }},
		{"seal stripped", func(c *schemas.TurnContext) { c.Seal = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := cloneContext(base)
			tt.edit(tc)
			if err := tc.Check(); err != nil {
				t.Fatalf("the edit made the context fail Check (%v); the test must edit authority, not validity", err)
			}
			wantCode(t, r.Verify(tc), schemas.CodeTurnContextTampered)
		})
	}
	// The edits above worked on copies.
	wantVerified(t, r, base)
}

func TestVerifyReasonCodes(t *testing.T) {
	r := twoKeyRing(t)
	base := sealed(t, r, newContext())
	tests := []struct {
		name string
		tc   func() *schemas.TurnContext
		want schemas.Code
	}{
		{"a nil context is missing", func() *schemas.TurnContext { return nil }, schemas.CodeTurnContextMissing},
		{"a seal naming a key the ring lacks is an unknown key", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.Seal.KeyID = "k9"
			return c
		}, schemas.CodeSealKeyUnknown},
		{"a seal naming a key id the ring could never hold is an unknown key", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.Seal.KeyID = "NOT A VALID ID"
			return c
		}, schemas.CodeSealKeyUnknown},
		{"an unknown context version is unsupported", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.V = schemas.TurnContextVersion + 1
			return c
		}, schemas.CodeSchemaVersionUnsupported},
		{"version zero is unsupported", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.V = 0
			return c
		}, schemas.CodeSchemaVersionUnsupported},
		{"a context without a turn id is invalid", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.TurnID = ""
			return c
		}, schemas.CodeTurnContextInvalid},
		{"a context without a requester principal is invalid", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.Requester.Principal = ""
			return c
		}, schemas.CodeTurnContextInvalid},
		{"a context with an unknown audience is invalid", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.Audience = "everyone"
			return c
		}, schemas.CodeTurnContextInvalid},
		{"a context with an empty key id is invalid", func() *schemas.TurnContext {
			c := cloneContext(base)
			c.Seal.KeyID = ""
			return c
		}, schemas.CodeTurnContextInvalid},
		{"an empty context is unsupported", func() *schemas.TurnContext { return &schemas.TurnContext{} }, schemas.CodeSchemaVersionUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCode(t, r.Verify(tt.tc()), tt.want)
		})
	}
}

func TestMACIsDomainSeparated(t *testing.T) {
	r := mustRing(t, "k1", map[string][]byte{"k1": k1Bytes})
	tc := sealed(t, r, newContext())
	body, err := schemas.SealedBytes(tc)
	if err != nil {
		t.Fatal(err)
	}
	plain := hmac.New(sha256.New, k1Bytes)
	plain.Write(body)
	if hmac.Equal(plain.Sum(nil), tc.Seal.MAC) {
		t.Fatal("the seal is HMAC(key, SealedBytes) with no domain separation")
	}
	// The domain string is part of the wire format: changing it invalidates
	// every persisted seal. Pin it.
	sep := hmac.New(sha256.New, k1Bytes)
	sep.Write([]byte("tollgate.turncontext.seal.v1\x00"))
	sep.Write(body)
	if !hmac.Equal(sep.Sum(nil), tc.Seal.MAC) {
		t.Fatal("the seal is not HMAC-SHA256(key, \"tollgate.turncontext.seal.v1\\x00\" || SealedBytes)")
	}
	// SealedBytes excludes the seal itself, so sealing is independent of any
	// seal already present.
	withSeal, _ := schemas.SealedBytes(tc)
	tc2 := cloneContext(tc)
	tc2.Seal = nil
	withoutSeal, _ := schemas.SealedBytes(tc2)
	if !bytes.Equal(withSeal, withoutSeal) {
		t.Fatal("SealedBytes depends on the seal")
	}
}

func TestNewRejectsBadRings(t *testing.T) {
	tests := []struct {
		name    string
		current string
		keys    map[string][]byte
	}{
		{"no keys", "k1", nil},
		{"an empty key map", "k1", map[string][]byte{}},
		{"a key of 31 bytes", "k1", map[string][]byte{"k1": k1Bytes[:31]}},
		{"an empty key", "k1", map[string][]byte{"k1": {}}},
		{"a short key that is not current", "k1", map[string][]byte{"k1": k1Bytes, "k2": k2Bytes[:16]}},
		{"an upper-case key id", "K1", map[string][]byte{"K1": k1Bytes}},
		{"a key id with a dot", "k.1", map[string][]byte{"k.1": k1Bytes}},
		{"a key id with a space", "k 1", map[string][]byte{"k 1": k1Bytes}},
		{"an empty key id", "", map[string][]byte{"": k1Bytes}},
		{"a key id of 33 characters", strings.Repeat("k", 33), map[string][]byte{strings.Repeat("k", 33): k1Bytes}},
		{"a current id not among the keys", "k2", map[string][]byte{"k1": k1Bytes}},
		{"an empty current id", "", map[string][]byte{"k1": k1Bytes}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r, err := seal.New(tt.current, tt.keys); err == nil {
				t.Fatalf("New accepted it: current %q ids %v", r.Current(), r.IDs())
			}
		})
	}
	t.Run("a key id of 32 characters of every allowed class is accepted", func(t *testing.T) {
		id := "abcdefghijklmnopqrstuvwxyz0_-789"
		r := mustRing(t, id, map[string][]byte{id: k1Bytes})
		if r.Current() != id {
			t.Fatalf("current %q, want %q", r.Current(), id)
		}
	})
	t.Run("the ring copies its keys", func(t *testing.T) {
		k := slices.Clone(k1Bytes)
		r := mustRing(t, "k1", map[string][]byte{"k1": k})
		tc := sealed(t, r, newContext())
		k[0] ^= 0xff
		wantVerified(t, r, tc)
	})
}

func TestRotationKeepsOldSealsUntilRetired(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.json")

	if err := seal.NewFile("k1").Write(path); err != nil {
		t.Fatal(err)
	}
	wantMode0600(t, path)
	r1, err := seal.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Current() != "k1" || !slices.Equal(r1.IDs(), []string{"k1"}) {
		t.Fatalf("new file: current %q ids %v", r1.Current(), r1.IDs())
	}
	old := sealed(t, r1, newContext())

	// Rotate to k2: the ring holds both, seals with k2.
	f, err := seal.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k1Enc := f.Keys["k1"]
	if err := f.Rotate("k2"); err != nil {
		t.Fatal(err)
	}
	if f.Keys["k1"] != k1Enc {
		t.Fatal("Rotate changed the old key")
	}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	wantMode0600(t, path)
	r2, err := seal.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Current() != "k2" || !slices.Equal(r2.IDs(), []string{"k1", "k2"}) {
		t.Fatalf("after rotate: current %q ids %v, want k2 [k1 k2]", r2.Current(), r2.IDs())
	}
	wantVerified(t, r2, old)
	fresh := sealed(t, r2, newContext())
	if fresh.Seal.KeyID != "k2" {
		t.Fatalf("after rotate a new seal uses %q, want k2", fresh.Seal.KeyID)
	}
	wantVerified(t, r2, fresh)
	// A worker not yet restarted (ring k1 only) does not know k2.
	wantCode(t, r1.Verify(fresh), schemas.CodeSealKeyUnknown)

	// Rotate to an id already present fails and changes nothing.
	f, err = seal.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"k1", "k2"} {
		before := f.Keys[id]
		if err := f.Rotate(id); err == nil {
			t.Fatalf("Rotate(%q) to an existing id succeeded", id)
		}
		if f.Keys[id] != before || f.Current != "k2" {
			t.Fatalf("a refused Rotate(%q) changed the file: current %q", id, f.Current)
		}
	}
	// Retiring the current key fails.
	if err := f.Retire("k2"); err == nil {
		t.Fatal("Retire of the current key succeeded")
	}
	// Retiring a key that is not there fails.
	if err := f.Retire("k7"); err == nil {
		t.Fatal("Retire of an absent key succeeded")
	}
	// Retire k1: k1 seals no longer verify.
	if err := f.Retire("k1"); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(path); err != nil {
		t.Fatal(err)
	}
	wantMode0600(t, path)
	r3, err := seal.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if r3.Current() != "k2" || !slices.Equal(r3.IDs(), []string{"k2"}) {
		t.Fatalf("after retire: current %q ids %v, want k2 [k2]", r3.Current(), r3.IDs())
	}
	wantCode(t, r3.Verify(old), schemas.CodeSealKeyUnknown)
	wantVerified(t, r3, fresh)

	// Write leaves no temporary files behind.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("dir holds %v, want only keys.json", names)
	}
}

func TestRotateWithABadIDLeavesTheFileUsable(t *testing.T) {
	tests := []struct{ name, id string }{
		{"an empty id", ""},
		{"an upper-case id", "K2"},
		{"an id with a slash", "k/2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := seal.NewFile("k1")
			k1 := f.Keys["k1"]
			if err := f.Rotate(tt.id); err == nil {
				t.Fatalf("Rotate(%q) succeeded", tt.id)
			}
			if f.Current != "k1" || len(f.Keys) != 1 || f.Keys["k1"] != k1 {
				t.Errorf("a refused Rotate(%q) changed the file: current %q, %d keys", tt.id, f.Current, len(f.Keys))
			}
			if _, err := f.Ring(); err != nil {
				t.Errorf("after a refused Rotate(%q) the file no longer makes a ring: %v", tt.id, err)
			}
		})
	}
}

func TestWriteRefusesAnInvalidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	f := &seal.File{Current: "k1", Keys: map[string]string{"k1": base64.StdEncoding.EncodeToString(k1Bytes[:8])}}
	if err := f.Write(path); err == nil {
		t.Fatal("Write of a file with a short key succeeded")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused Write left %s behind (%v)", path, err)
	}
}

func TestLoadChecksPermissions(t *testing.T) {
	content := keyFileJSON(t, "k1", map[string][]byte{"k1": k1Bytes})
	tests := []struct {
		name string
		mode fs.FileMode
		ok   bool
	}{
		{"owner read-write is accepted", 0o600, true},
		{"owner read-only is accepted", 0o400, true},
		{"group readable is refused", 0o640, false},
		{"world readable is refused", 0o604, false},
		{"group writable is refused", 0o620, false},
		{"world executable is refused", 0o601, false},
		{"readable by all is refused", 0o644, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeKeyFile(t, content, tt.mode)
			r, err := seal.Load(path)
			if tt.ok {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if r.Current() != "k1" {
					t.Fatalf("current %q", r.Current())
				}
				return
			}
			if err == nil {
				t.Fatalf("Load accepted a key file with mode %v", tt.mode)
			}
			if !strings.Contains(err.Error(), "mode") || !strings.Contains(err.Error(), tt.mode.String()) {
				t.Fatalf("error %q does not name the mode %v", err, tt.mode)
			}
			if _, err := seal.ReadFile(path); err == nil {
				t.Fatal("ReadFile accepted it")
			}
		})
	}
	t.Run("a missing file is an error", func(t *testing.T) {
		if _, err := seal.Load(filepath.Join(t.TempDir(), "nope.json")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("got %v, want an os.ErrNotExist error", err)
		}
	})
	t.Run("a bad file names its path", func(t *testing.T) {
		path := writeKeyFile(t, `{"current":"k1","keys":{"k1":"c2hvcnQ="}}`, 0o600)
		_, err := seal.Load(path)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("got %v, want an error naming %s", err, path)
		}
	})
}

func TestParse(t *testing.T) {
	good := keyFileJSON(t, "k2", map[string][]byte{"k1": k1Bytes, "k2": k2Bytes})
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	tests := []struct {
		name string
		in   string
		ok   bool
	}{
		{"a well-formed file", good, true},
		{"a file with surrounding white space", "\n  " + good + "\n\n", true},
		{"a key longer than the minimum", `{"current":"k3","keys":{"k3":"` + b64(k3Bytes) + `"}}`, true},
		{"an unknown field", `{"current":"k1","keys":{"k1":"` + b64(k1Bytes) + `"},"algorithm":"none"}`, false},
		{"trailing data after the object", good + `{"current":"k1"}`, false},
		{"trailing garbage after the object", good + `x`, false},
		{"a trailing closing brace", good + `}`, false},
		{"a trailing closing bracket", good + `]`, false},
		{"a key that is not base64", `{"current":"k1","keys":{"k1":"not base64!!"}}`, false},
		{"a key in URL-safe base64", `{"current":"k1","keys":{"k1":"` + base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 33)) + `"}}`, false},
		{"a key of 31 bytes", `{"current":"k1","keys":{"k1":"` + b64(k1Bytes[:31]) + `"}}`, false},
		{"an empty key", `{"current":"k1","keys":{"k1":""}}`, false},
		{"an upper-case key id", `{"current":"K1","keys":{"K1":"` + b64(k1Bytes) + `"}}`, false},
		{"a key id with a space", `{"current":"k 1","keys":{"k 1":"` + b64(k1Bytes) + `"}}`, false},
		{"an empty key id", `{"current":"","keys":{"":"` + b64(k1Bytes) + `"}}`, false},
		{"a key id of 33 characters", `{"current":"` + strings.Repeat("a", 33) + `","keys":{"` + strings.Repeat("a", 33) + `":"` + b64(k1Bytes) + `"}}`, false},
		{"a current id not among the keys", `{"current":"k2","keys":{"k1":"` + b64(k1Bytes) + `"}}`, false},
		{"no current id", `{"keys":{"k1":"` + b64(k1Bytes) + `"}}`, false},
		{"empty keys", `{"current":"k1","keys":{}}`, false},
		{"no keys field", `{"current":"k1"}`, false},
		{"null", `null`, false},
		{"an empty document", ``, false},
		{"an array", `[]`, false},
		{"keys as a list", `{"current":"k1","keys":["` + b64(k1Bytes) + `"]}`, false},
		{"truncated JSON", good[:len(good)-1], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := seal.Parse([]byte(tt.in))
			if !tt.ok {
				if err == nil {
					t.Fatalf("Parse accepted %q: current %q ids %v", tt.in, r.Current(), r.IDs())
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tc := sealed(t, r, newContext())
			wantVerified(t, r, tc)
		})
	}
	t.Run("a parsed ring verifies what a ring of the same keys sealed", func(t *testing.T) {
		r, err := seal.Parse([]byte(good))
		if err != nil {
			t.Fatal(err)
		}
		tc := sealed(t, mustRing(t, "k1", map[string][]byte{"k1": k1Bytes}), newContext())
		wantVerified(t, r, tc)
		if r.Current() != "k2" || !slices.Equal(r.IDs(), []string{"k1", "k2"}) {
			t.Fatalf("current %q ids %v", r.Current(), r.IDs())
		}
	})
}

func TestEnsureFileCreatesOnceThenLoads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seal-keys.json")
	r1, created, err := seal.EnsureFile(path)
	if err != nil {
		t.Fatalf("first EnsureFile: %v", err)
	}
	if !created {
		t.Fatal("first EnsureFile: created = false, want true")
	}
	wantMode0600(t, path)
	if r1.Current() != "k1" {
		t.Fatalf("a new file's current key is %q, want k1", r1.Current())
	}
	tc := sealed(t, r1, newContext())

	r2, created, err := seal.EnsureFile(path)
	if err != nil {
		t.Fatalf("second EnsureFile: %v", err)
	}
	if created {
		t.Fatal("second EnsureFile: created = true, want false")
	}
	wantVerified(t, r2, tc)
	wantVerified(t, r1, sealed(t, r2, newContext()))
	wantMode0600(t, path)

	// The file is a normal key file: Load reads the same keys.
	r3, err := seal.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	wantVerified(t, r3, tc)

	// Two EnsureFiles on different paths make different keys.
	other, _, err := seal.EnsureFile(filepath.Join(t.TempDir(), "seal-keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, other.Verify(tc), schemas.CodeTurnContextTampered)
}

func TestEnsureFileRefusesAnExistingBadFile(t *testing.T) {
	tests := []struct {
		name    string
		content string
		mode    fs.FileMode
	}{
		{"a group-readable file", keyFileJSON(t, "k1", map[string][]byte{"k1": k1Bytes}), 0o640},
		{"an empty file", "", 0o600},
		{"a file that is not JSON", "hello", 0o600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeKeyFile(t, tt.content, tt.mode)
			if _, _, err := seal.EnsureFile(path); err == nil {
				t.Fatal("EnsureFile accepted it")
			}
			b, _ := os.ReadFile(path)
			if string(b) != tt.content {
				t.Fatal("EnsureFile changed an existing file")
			}
		})
	}
	t.Run("a directory that does not exist", func(t *testing.T) {
		if _, _, err := seal.EnsureFile(filepath.Join(t.TempDir(), "no", "such", "keys.json")); err == nil {
			t.Fatal("EnsureFile succeeded")
		}
	})
}

// Two processes starting together (tollgate dev twice on one data dir) must
// end up with one key ring: each verifies the other's seals, neither fails.
func TestEnsureFileConcurrentCallsAgreeOnOneRing(t *testing.T) {
	const rounds, workers = 100, 4
	for round := range rounds {
		path := filepath.Join(t.TempDir(), "seal-keys.json")
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			rings   [workers]*seal.KeyRing
			created [workers]bool
			errs    [workers]error
		)
		for i := range workers {
			wg.Go(func() {
				<-start
				rings[i], created[i], errs[i] = seal.EnsureFile(path)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: EnsureFile in goroutine %d: %v", round, i, err)
			}
		}
		if n := len(slices.DeleteFunc(slices.Clone(created[:]), func(c bool) bool { return !c })); n != 1 {
			t.Fatalf("round %d: %d calls report they created the file, want 1", round, n)
		}
		for i := range workers {
			tc := sealed(t, rings[i], newContext())
			for j := range workers {
				if err := rings[j].Verify(tc); err != nil {
					t.Fatalf("round %d: a seal from goroutine %d does not verify in goroutine %d: %v", round, i, j, err)
				}
			}
		}
		wantMode0600(t, path)
	}
}

func TestFromEnv(t *testing.T) {
	dir := t.TempDir()
	fileA := filepath.Join(dir, "a.json")
	fileB := filepath.Join(dir, "b.json")
	if err := (&seal.File{Current: "ka", Keys: map[string]string{"ka": base64.StdEncoding.EncodeToString(k1Bytes)}}).Write(fileA); err != nil {
		t.Fatal(err)
	}
	if err := (&seal.File{Current: "kb", Keys: map[string]string{"kb": base64.StdEncoding.EncodeToString(k2Bytes)}}).Write(fileB); err != nil {
		t.Fatal(err)
	}
	inline := keyFileJSON(t, "kc", map[string][]byte{"kc": k3Bytes})

	tests := []struct {
		name        string
		path        string
		envKeys     string
		envKeyFile  string
		wantCurrent string
		wantErr     error // checked with errors.Is when set
		wantFail    bool
	}{
		{"an explicit path wins over both variables", fileA, inline, fileB, "ka", nil, false},
		{"an explicit path alone", fileA, "", "", "ka", nil, false},
		{"inline keys win over the key file variable", "", inline, fileB, "kc", nil, false},
		{"inline keys alone", "", inline, "", "kc", nil, false},
		{"the key file variable alone", "", "", fileB, "kb", nil, false},
		{"nothing configured is ErrNoKeys", "", "", "", "", seal.ErrNoKeys, true},
		{"bad inline keys fail rather than fall through to the file", "", `{"current":"k1"}`, fileB, "", nil, true},
		{"a missing explicit path fails rather than fall through", filepath.Join(dir, "missing.json"), inline, fileB, "", os.ErrNotExist, true},
		{"a missing key file fails", "", "", filepath.Join(dir, "missing.json"), "", os.ErrNotExist, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(seal.EnvKeys, tt.envKeys)
			t.Setenv(seal.EnvKeyFile, tt.envKeyFile)
			r, err := seal.FromEnv(tt.path)
			if tt.wantFail {
				if err == nil {
					t.Fatalf("FromEnv succeeded with current %q", r.Current())
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v, want errors.Is %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromEnv: %v", err)
			}
			if r.Current() != tt.wantCurrent {
				t.Fatalf("current %q, want %q", r.Current(), tt.wantCurrent)
			}
		})
	}
	t.Run("the variable names are the documented ones", func(t *testing.T) {
		if seal.EnvKeys != "TOLLGATE_SEAL_KEYS" || seal.EnvKeyFile != "TOLLGATE_SEAL_KEY_FILE" {
			t.Fatalf("EnvKeys %q EnvKeyFile %q", seal.EnvKeys, seal.EnvKeyFile)
		}
	})
}

func TestNewKeyIsRandomAndLongEnough(t *testing.T) {
	seen := map[string]bool{}
	for range 8 {
		enc := seal.NewKey()
		k, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			t.Fatalf("NewKey %q is not base64: %v", enc, err)
		}
		if len(k) < seal.MinKeyBytes {
			t.Fatalf("NewKey is %d bytes", len(k))
		}
		if seen[enc] {
			t.Fatal("NewKey repeated a key")
		}
		seen[enc] = true
	}
	f := seal.NewFile("dev")
	if f.Current != "dev" || len(f.Keys) != 1 {
		t.Fatalf("NewFile: %+v", f)
	}
	if _, err := f.Ring(); err != nil {
		t.Fatal(err)
	}
}

func TestKeyRingIsSafeForConcurrentUse(t *testing.T) {
	r := twoKeyRing(t)
	base := sealed(t, r, newContext())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if err := r.Verify(base); err != nil {
					t.Error(err)
					return
				}
				if err := r.Seal(newContext()); err != nil {
					t.Error(err)
					return
				}
				_ = r.IDs()
			}
		})
	}
	wg.Wait()
}
