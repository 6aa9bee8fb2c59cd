package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Scope is what an API key may do.
type Scope string

const (
	ScopeSubmit Scope = "submit" // submit turns
	ScopeRead   Scope = "read"   // read turns, approvals and events
	ScopeDecide Scope = "decide" // decide approvals
)

// Key is one API key, as stored: only the SHA-256 of its secret token is
// kept. A key is bound to one transport name: everything it submits or
// decides is published as that transport, and it sees only that
// transport's turns and approvals. Rotation is several keys for one
// transport, the old one given a NotAfter.
type Key struct {
	// ID is the public part of the token tg_<id>_<secret>: [a-z0-9]{1,32}.
	ID string `json:"id"`
	// Hash is "sha256:" + hex SHA-256 of the whole token.
	Hash string `json:"hash"`
	// Transport is the transport name the key acts as.
	Transport string  `json:"transport"`
	Scopes    []Scope `json:"scopes"`
	// VouchVerified: senders and deciders of this key's requests are
	// marked verified (the key's holder authenticated them). Without it,
	// every sender is unverified and can neither answer prompts nor decide.
	VouchVerified bool `json:"vouch_verified,omitempty"`
	// NotAfter, when set, is when the key stops working (KEY_EXPIRED).
	NotAfter time.Time `json:"not_after,omitzero"`
	// Note is free text for operators.
	Note string `json:"note,omitempty"`
}

// KeysFile is the JSON document LoadKeys reads.
type KeysFile struct {
	Keys []Key `json:"keys"`
}

var (
	keyIDRe     = regexp.MustCompile(`^[a-z0-9]{1,32}$`)
	transportRe = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`) // docs/protocol.md §2.5
)

// Allows reports whether k has scope sc.
func (k *Key) Allows(sc Scope) bool { return slices.Contains(k.Scopes, sc) }

// ValidateKeys checks every key's fields and that ids are unique.
func ValidateKeys(keys []Key) error {
	seen := map[string]bool{}
	for _, k := range keys {
		if !keyIDRe.MatchString(k.ID) {
			return fmt.Errorf("gateway: key id %q: want [a-z0-9]{1,32}", k.ID)
		}
		if seen[k.ID] {
			return fmt.Errorf("gateway: key id %q listed twice", k.ID)
		}
		seen[k.ID] = true
		if h, ok := strings.CutPrefix(k.Hash, "sha256:"); !ok || len(h) != 64 {
			return fmt.Errorf("gateway: key %s: hash must be sha256:<64 hex>", k.ID)
		}
		if !transportRe.MatchString(k.Transport) {
			return fmt.Errorf("gateway: key %s: transport %q: want [a-z0-9_-]{1,64}", k.ID, k.Transport)
		}
		if len(k.Scopes) == 0 {
			return fmt.Errorf("gateway: key %s: no scopes", k.ID)
		}
		for _, sc := range k.Scopes {
			if sc != ScopeSubmit && sc != ScopeRead && sc != ScopeDecide {
				return fmt.Errorf("gateway: key %s: unknown scope %q", k.ID, sc)
			}
		}
	}
	return nil
}

// LoadKeys reads a keys file (KeysFile, JSON; unknown fields refused) and
// validates it.
func LoadKeys(path string) ([]Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var f KeysFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("gateway: keys file %s: %w", path, err)
	}
	if err := ValidateKeys(f.Keys); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f.Keys, nil
}

// NewKey makes a fresh key: the token to hand to its holder (shown once,
// never stored) and the Key to store.
func NewKey(transport string, scopes []Scope, vouch bool) (token string, k Key) {
	id := make([]byte, 6)
	secret := make([]byte, 32)
	_, _ = rand.Read(id)
	_, _ = rand.Read(secret)
	token = "tg_" + hex.EncodeToString(id) + "_" + hex.EncodeToString(secret)
	return token, Key{ID: hex.EncodeToString(id), Hash: HashToken(token), Transport: transport, Scopes: scopes, VouchVerified: vouch}
}

// HashToken is the stored form of a token.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(h[:])
}

// apiError is a request failure with its HTTP status and reason code.
type apiError struct {
	Status int
	Code   schemas.Code
	Detail string
}

func (e *apiError) Error() string { return string(e.Code) + ": " + e.Detail }

func errorf(status int, code schemas.Code, format string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Detail: fmt.Sprintf(format, args...)}
}

// authenticate finds the request's API key (Authorization: Bearer
// tg_<id>_<secret>) and checks that it has scope and has not expired. It
// writes nothing: on failure it returns an *apiError (401
// UNAUTHENTICATED, 401 KEY_EXPIRED, 403 SCOPE_MISSING) for the handler to
// write. The secret is compared in constant time.
func (s *Server) authenticate(r *http.Request, scope Scope) (*Key, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return nil, errorf(http.StatusUnauthorized, CodeUnauthenticated, "an API key is required: Authorization: Bearer tg_<id>_<secret>")
	}
	rest, ok := strings.CutPrefix(token, "tg_")
	id, _, ok2 := strings.Cut(rest, "_")
	k := s.keys[id]
	if !ok || !ok2 || k == nil || subtle.ConstantTimeCompare([]byte(HashToken(token)), []byte(k.Hash)) != 1 {
		return nil, errorf(http.StatusUnauthorized, CodeUnauthenticated, "unknown API key")
	}
	if !k.NotAfter.IsZero() && !s.cfg.Now().Before(k.NotAfter) {
		return nil, errorf(http.StatusUnauthorized, CodeKeyExpired, "API key %s expired at %s", k.ID, k.NotAfter.UTC().Format(time.RFC3339))
	}
	if !k.Allows(scope) {
		return nil, errorf(http.StatusForbidden, CodeScopeMissing, "API key %s may not %s", k.ID, scope)
	}
	return k, nil
}

// errUnknown is what the API says for a turn or approval that does not
// exist or belongs to another transport: the two are not told apart.
var errUnknown = errors.New("not found")
