// Package seal authenticates TurnContexts: ingest seals the context it
// builds, and every stage verifies the seal before using a persisted context
// as authority. A context edited in storage (audience widened, requester
// swapped), stripped of its seal, or sealed with a key no longer listed is
// rejected with a reason code, so the call it would authorize never runs.
//
// The seal is HMAC-SHA256 over schemas.SealedBytes, prefixed by a domain
// separation string, and names the key that made it. A KeyRing signs with
// its current key and verifies with any key it lists, so keys rotate
// without invalidating contexts sealed before: add a new key and make it
// current everywhere, wait until no pending work was sealed with the old
// key (the longest approval expiry), then remove it. See docs/security.md.
//
// HMAC is symmetric: every worker that can verify can also seal. The seal
// defends against whoever can write to the bus or KV but does not hold the
// key (a compromised transport, an operator's stray edit, a replayed or
// crafted record); it does not defend against a compromised worker.
package seal

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tollgate-dev/tollgate/schemas"
)

// MinKeyBytes is the shortest key accepted: 256 bits.
const MinKeyBytes = 32

// domain separates this MAC from any other use of the same key.
const domain = "tollgate.turncontext.seal.v1\x00"

// KeyRing holds the sealing keys. It is immutable and safe for concurrent use.
type KeyRing struct {
	current string
	keys    map[string][]byte
	macs    map[string]*sync.Pool // per key: reusable HMAC states
}

// New returns a key ring that seals with keys[current] and verifies with any
// of keys. Key ids are 1-32 characters of [a-z0-9_-]; keys are at least
// MinKeyBytes long.
func New(current string, keys map[string][]byte) (*KeyRing, error) {
	if len(keys) == 0 {
		return nil, errors.New("seal: no keys")
	}
	for id, k := range keys {
		if !validID(id) {
			return nil, fmt.Errorf("seal: key id %q: want 1-32 characters of a-z 0-9 _ -", id)
		}
		if len(k) < MinKeyBytes {
			return nil, fmt.Errorf("seal: key %s is %d bytes, want at least %d", id, len(k), MinKeyBytes)
		}
	}
	if _, ok := keys[current]; !ok {
		return nil, fmt.Errorf("seal: current key %q is not among the keys", current)
	}
	r := &KeyRing{current: current, keys: make(map[string][]byte, len(keys)), macs: make(map[string]*sync.Pool, len(keys))}
	for id, k := range keys {
		k := slices.Clone(k)
		r.keys[id] = k
		r.macs[id] = &sync.Pool{New: func() any { return hmac.New(sha256.New, k) }}
	}
	return r, nil
}

func validID(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Current is the id of the key new seals are made with.
func (r *KeyRing) Current() string { return r.current }

// IDs lists the key ids the ring verifies with, sorted.
func (r *KeyRing) IDs() []string { return slices.Sorted(maps.Keys(r.keys)) }

// Seal sets tc.Seal to a seal over tc's other fields with the current key.
// tc must pass tc.Check; sealing an unusable context is an error.
func (r *KeyRing) Seal(tc *schemas.TurnContext) error {
	if err := tc.Check(); err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	mac, err := r.mac(r.current, tc)
	if err != nil {
		return err
	}
	tc.Seal = &schemas.Seal{KeyID: r.current, MAC: mac}
	return nil
}

// Verify reports whether tc is a usable, authentic authority. It returns nil
// or an *schemas.Error:
//
//   - TURN_CONTEXT_MISSING: tc is nil;
//   - SCHEMA_VERSION_UNSUPPORTED or TURN_CONTEXT_INVALID: see tc.Check;
//   - TURN_CONTEXT_TAMPERED: no seal, or the seal does not match the fields;
//   - SEAL_KEY_UNKNOWN: the seal names a key the ring does not hold.
func (r *KeyRing) Verify(tc *schemas.TurnContext) error {
	if err := tc.Check(); err != nil {
		return err
	}
	if tc.Seal == nil {
		return schemas.Errorf(schemas.CodeTurnContextTampered, "TurnContext of turn %s carries no seal", tc.TurnID)
	}
	if _, ok := r.keys[tc.Seal.KeyID]; !ok {
		return schemas.Errorf(schemas.CodeSealKeyUnknown, "TurnContext of turn %s is sealed with key %q, which is not in the key ring", tc.TurnID, clipID(tc.Seal.KeyID))
	}
	want, err := r.mac(tc.Seal.KeyID, tc)
	if err != nil {
		return schemas.Errorf(schemas.CodeTurnContextTampered, "TurnContext of turn %s cannot be encoded: %v", tc.TurnID, err)
	}
	if !hmac.Equal(want, tc.Seal.MAC) {
		return schemas.Errorf(schemas.CodeTurnContextTampered, "the seal of turn %s's TurnContext does not match its fields", tc.TurnID)
	}
	return nil
}

func clipID(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// mac is the HMAC-SHA256 with key id of the domain string followed by
// schemas.SealedBytes(tc). The HMAC states are pooled per key (hmac.New
// allocates two SHA-256 states and derives the pads each time); the
// context is encoded straight into the hash.
func (r *KeyRing) mac(id string, tc *schemas.TurnContext) ([]byte, error) {
	pool := r.macs[id]
	h := pool.Get().(hash.Hash)
	defer pool.Put(h)
	h.Reset()
	h.Write([]byte(domain))
	if err := schemas.WriteSealed(h, tc); err != nil {
		return nil, fmt.Errorf("seal: encode context: %w", err)
	}
	return h.Sum(make([]byte, 0, sha256.Size)), nil
}

// File is the JSON key file: the current key id and every key, base64
// (standard encoding) of at least MinKeyBytes random bytes.
//
//	{"current": "k2", "keys": {"k1": "…", "k2": "…"}}
type File struct {
	Current string            `json:"current"`
	Keys    map[string]string `json:"keys"`
}

// Parse reads a key file's JSON. Unknown fields are rejected.
func Parse(b []byte) (*KeyRing, error) {
	f, err := parseFile(b)
	if err != nil {
		return nil, err
	}
	return f.Ring()
}

func parseFile(b []byte) (*File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("seal: parse keys: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("seal: parse keys: trailing data after the key object")
	}
	return &f, nil
}

// Ring decodes the keys of f.
func (f *File) Ring() (*KeyRing, error) {
	keys := make(map[string][]byte, len(f.Keys))
	for id, enc := range f.Keys {
		k, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			return nil, fmt.Errorf("seal: key %s: not base64: %w", id, err)
		}
		keys[id] = k
	}
	return New(f.Current, keys)
}

// Load reads a key file. It refuses a file that group or others may read
// or write: a leaked key lets its holder forge any authority.
func Load(path string) (*KeyRing, error) {
	f, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := f.Ring()
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return r, nil
}

// ReadFile reads and parses a key file, checking its permissions (see Load).
func ReadFile(path string) (*File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("seal: key file %s has mode %v: it must not be accessible to group or others (chmod 600)", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	f, err := parseFile(b)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	return f, nil
}

// Environment variables FromEnv reads.
const (
	EnvKeys    = "TOLLGATE_SEAL_KEYS"     // the key file's JSON, inline
	EnvKeyFile = "TOLLGATE_SEAL_KEY_FILE" // path of the key file
)

// ErrNoKeys means neither a key file nor inline keys were configured.
var ErrNoKeys = errors.New("seal: no keys configured: set " + EnvKeyFile + " (or --seal-keys) to a key file, or " + EnvKeys + " to its JSON; `tollgate keys new` makes one")

// FromEnv loads the key ring from path if it is not empty, else from
// TOLLGATE_SEAL_KEYS, else from TOLLGATE_SEAL_KEY_FILE. It fails with
// ErrNoKeys when none is set: there is no default key.
func FromEnv(path string) (*KeyRing, error) {
	if path != "" {
		return Load(path)
	}
	if v := os.Getenv(EnvKeys); v != "" {
		return Parse([]byte(v))
	}
	if p := os.Getenv(EnvKeyFile); p != "" {
		return Load(p)
	}
	return nil, ErrNoKeys
}

// NewKey returns MinKeyBytes random bytes, base64.
func NewKey() string {
	k := make([]byte, MinKeyBytes)
	rand.Read(k) // never fails (crypto/rand, Go 1.24+)
	return base64.StdEncoding.EncodeToString(k)
}

// NewFile returns a key file holding one new key, current, named id.
func NewFile(id string) *File {
	return &File{Current: id, Keys: map[string]string{id: NewKey()}}
}

// Write writes f to path with mode 0600, atomically (a temporary file in the
// same directory, synced, then renamed), replacing any file there.
func (f *File) Write(path string) error {
	tmp, err := f.writeTemp(path)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	return nil
}

// writeTemp writes f, complete and synced, to a new 0600 file next to path
// and returns its name.
func (f *File) writeTemp(path string) (string, error) {
	if _, err := f.Ring(); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".seal-keys-*")
	if err != nil {
		return "", fmt.Errorf("seal: %w", err)
	}
	fail := func(err error) (string, error) {
		tmp.Close()
		os.Remove(tmp.Name())
		return "", fmt.Errorf("seal: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		return fail(err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("seal: %w", err)
	}
	return tmp.Name(), nil
}

// EnsureFile loads the key file at path, creating it (mode 0600, one new key
// "k1") if it does not exist. It is what `tollgate dev` uses for its data dir.
// The file appears complete or not at all (written to a synced temporary
// file, then hard-linked into place, which fails if another process got
// there first), so concurrent first starts agree on one key and a crash
// never leaves an empty key file.
func EnsureFile(path string) (r *KeyRing, created bool, err error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		f := NewFile("k1")
		tmp, err := f.writeTemp(path)
		if err != nil {
			return nil, false, err
		}
		defer os.Remove(tmp)
		err = os.Link(tmp, path)
		if err == nil {
			r, err := f.Ring()
			return r, true, err
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, false, fmt.Errorf("seal: create %s: %w", path, err)
		}
	}
	r, err = Load(path)
	return r, false, err
}

// Rotate adds a new key named id to f and makes it current. The old keys
// stay, so contexts sealed with them still verify.
func (f *File) Rotate(id string) error {
	if !validID(id) {
		return fmt.Errorf("seal: key id %q: want 1-32 characters of a-z 0-9 _ -", id)
	}
	if _, dup := f.Keys[id]; dup {
		return fmt.Errorf("seal: key %s already exists", id)
	}
	if f.Keys == nil {
		f.Keys = map[string]string{}
	}
	f.Keys[id] = NewKey()
	f.Current = id
	_, err := f.Ring()
	return err
}

// Retire removes key id from f. The current key cannot be retired.
func (f *File) Retire(id string) error {
	if id == f.Current {
		return fmt.Errorf("seal: %s is the current key; rotate first", id)
	}
	if _, ok := f.Keys[id]; !ok {
		return fmt.Errorf("seal: no key %s", id)
	}
	delete(f.Keys, id)
	return nil
}
