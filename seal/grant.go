package seal

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"

	"github.com/tollgate-dev/tollgate/schemas"
)

// grantDomain separates a grant's MAC from a TurnContext's seal made with
// the same key: one can never stand in for the other.
const grantDomain = "tollgate.grant.mac.v1\x00"

// SealGrant sets g.MAC to an HMAC-SHA256, with the current key, over
// schemas.GrantSealedBytes(g) (every field but MAC and Revoked). g's
// TurnContext must verify first: a grant is never made from an
// unauthenticated turn. It stamps g with the current grant version.
func (r *KeyRing) SealGrant(g *schemas.Grant) error {
	if err := r.Verify(g.Context); err != nil {
		return err
	}
	g.V = schemas.GrantVersion // as it will be stored: the MAC covers the version
	mac, err := r.grantMAC(r.current, g)
	if err != nil {
		return err
	}
	g.MAC = &schemas.Seal{KeyID: r.current, MAC: mac}
	return nil
}

// VerifyGrant reports, with nil, whether g is an authentic grant: its
// TurnContext verifies (Verify) and its MAC matches its fields with a key
// of the ring. Otherwise it returns a *schemas.Error with code
// GRANT_INVALID (wrapping the context's own code where that is the cause):
// a forged or edited record decides nothing.
func (r *KeyRing) VerifyGrant(g *schemas.Grant) error {
	if g == nil {
		return schemas.Errorf(schemas.CodeGrantInvalid, "no grant")
	}
	if err := r.Verify(g.Context); err != nil {
		return schemas.Errorf(schemas.CodeGrantInvalid, "grant %s: its TurnContext does not verify: %w", g.GrantID, err)
	}
	if g.MAC == nil {
		return schemas.Errorf(schemas.CodeGrantInvalid, "grant %s carries no MAC", g.GrantID)
	}
	if _, ok := r.keys[g.MAC.KeyID]; !ok {
		return schemas.Errorf(schemas.CodeGrantInvalid, "grant %s is sealed with key %q, which is not in the key ring", g.GrantID, clipID(g.MAC.KeyID))
	}
	want, err := r.grantMAC(g.MAC.KeyID, g)
	if err != nil || !hmac.Equal(want, g.MAC.MAC) {
		return schemas.Errorf(schemas.CodeGrantInvalid, "the MAC of grant %s does not match its fields", g.GrantID)
	}
	return nil
}

func (r *KeyRing) grantMAC(id string, g *schemas.Grant) ([]byte, error) {
	pool := r.macs[id]
	h := pool.Get().(hash.Hash)
	defer pool.Put(h)
	h.Reset()
	h.Write([]byte(grantDomain))
	if err := schemas.WriteGrantSealed(h, g); err != nil {
		return nil, err
	}
	return h.Sum(make([]byte, 0, sha256.Size)), nil
}
