package seal

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
)

// Tag is an HMAC-SHA256, with the ring's current key, of msg under
// domain, and the id of that key: for a short-lived token that the
// processes holding the ring hand out and take back, such as the web
// inbox's sign-in cookie. domain separates each such use from every
// other, and from the seals and grant MACs made with the same key: a tag
// of one domain is never valid in another. Tags verify with any key of
// the ring (CheckTag), so they survive a rotation while the old key is
// listed.
func (r *KeyRing) Tag(domain string, msg []byte) (keyID string, mac []byte) {
	return r.current, r.tag(r.current, domain, msg)
}

// CheckTag reports whether mac is Tag's tag of msg under domain with key
// keyID of the ring (false for a key the ring does not hold).
func (r *KeyRing) CheckTag(domain, keyID string, msg, mac []byte) bool {
	if _, ok := r.keys[keyID]; !ok {
		return false
	}
	return hmac.Equal(r.tag(keyID, domain, msg), mac)
}

// tagDomain prefixes every Tag's domain, apart from the seal's and the
// grant MAC's domains.
const tagDomain = "tollgate.tag.v1\x00"

func (r *KeyRing) tag(id, domain string, msg []byte) []byte {
	pool := r.macs[id]
	h := pool.Get().(hash.Hash)
	defer pool.Put(h)
	h.Reset()
	h.Write([]byte(tagDomain))
	h.Write([]byte(domain))
	h.Write([]byte{0})
	h.Write(msg)
	return h.Sum(make([]byte, 0, sha256.Size))
}
