package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
)

// cookieName names the session cookie.
const cookieName = "tollgate_session"

// signinCookie names the cookie of a visitor who has not signed in
// (signinState): it is signed, not stored.
const signinCookie = "tollgate_signin"

// signinTTL is how long a signinState lasts: the sign-in form's CSRF
// token, and an OIDC sign-in in progress.
const signinTTL = 30 * time.Minute

// signinTagDomain is the domain of the signinState cookie's tag
// (seal.KeyRing.Tag).
const signinTagDomain = "web.signin"

// sessionOpTimeout bounds one read or write of the sessions bucket.
const sessionOpTimeout = 5 * time.Second

// session is one browser's state: a signed-in person's, kept in the
// sessions bucket; or, with subject "" (signed out), a visitor's, kept in
// nothing but the browser's signed sign-in cookie (signinState).
type session struct {
	id      string // the cookie's value; never stored
	key     string // the bucket key: "s." + hex(SHA-256(id)); "" for a visitor
	rev     uint64 // the record's revision
	subject string
	display string
	strong  bool // the sign-in showed a second factor
	csrf    string
	created time.Time
	expires time.Time
	login   *loginState // a visitor's OIDC sign-in in progress
}

// sessionRecord is a session as stored in the sessions bucket.
type sessionRecord struct {
	Subject string    `json:"subject,omitempty"`
	Display string    `json:"display,omitempty"`
	Strong  bool      `json:"strong,omitempty"`
	CSRF    string    `json:"csrf"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// revokedRecord is stored at "u." + hex(SHA-256(subject)) when a person
// signs out everywhere: every session of theirs created before Before is
// no session.
type revokedRecord struct {
	Before time.Time `json:"before"`
}

// SignedIn reports whether the session belongs to a person.
func (s *session) SignedIn() bool { return s != nil && s.subject != "" }

// Principal is the session's principal, web:<subject>.
func (s *session) Principal() string { return schemas.Principal(Transport, s.subject) }

// Strong reports whether the sign-in showed a second factor.
func (s *session) Strong() bool { return s.strong }

// decider is the session's person as the inbox vouches for them.
func (s *session) decider() schemas.Sender {
	return schemas.Sender{ID: s.subject, Display: s.display, Kind: schemas.SenderUser, Verified: true, Strong: s.strong}
}

// deciderKey names everything of the person that the decider rule reads
// (decider and channel are functions of it): verdicts are kept by it.
func (s *session) deciderKey() string {
	if s.strong {
		return s.subject + "\x00strong"
	}
	return s.subject
}

// channel is where a decision from the inbox is posted: the person's own
// inbox, which only they see (a personal channel).
func (s *session) channel() *schemas.Channel {
	return &schemas.Channel{ID: "inbox-" + s.subject, Kind: schemas.ChannelDM}
}

// sessions keeps the inbox's sessions in the JetStream KV bucket
// tollgate_web_sessions, so that any process serving the inbox (a
// restarted one, another replica) knows every session: nothing about a
// session lives in one process's memory.
//
// Only a person who has signed in has a session there: a visitor who has
// not costs no write (their form token and sign-in in progress are in a
// signed cookie, signinState).
//
// A cookie carries a random 192-bit id; the bucket holds the session under
// the SHA-256 of that id, so whoever reads the bucket learns no cookie. A
// session is written with a per-message TTL (its lifetime), after which
// the server removes it; a read also refuses a record past its expiry. A
// cookie whose id names no record (unknown, signed out, expired, forged)
// is no session. Signing out purges the record: every process refuses the
// cookie from then on. Signing out everywhere also stores, for the
// person, the time before which every session of theirs is no session.
type sessions struct {
	kv  jetstream.KeyValue
	ttl time.Duration
	now func() time.Time
}

func newSessions(kv jetstream.KeyValue, ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{kv: kv, ttl: ttl, now: now}
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashKey(prefix, v string) string {
	h := sha256.Sum256([]byte(v))
	return prefix + hex.EncodeToString(h[:])
}

// sessionKey is the bucket key of the session whose cookie carries id.
func sessionKey(id string) string { return hashKey("s.", id) }

// revokedKey is the bucket key of subject's sign-out-everywhere time.
func revokedKey(subject string) string { return hashKey("u.", subject) }

// sessionCtxKey keys the session a request's session was read as
// (Server.ServeHTTP reads it once per request).
type sessionCtxKey struct{}

// get returns the request's live signed-in session, or nil: no cookie,
// no record, a record past its expiry, one created before its person
// signed out everywhere, or the bucket unreachable. It is read once per
// request (ServeHTTP); reload reads it again.
func (ss *sessions) get(r *http.Request) *session {
	if v, ok := r.Context().Value(sessionCtxKey{}).(*session); ok || v != nil {
		return v
	}
	return ss.reload(r)
}

// reload reads the request's session from the bucket, as get first did:
// for a long response that must notice the session's end.
func (ss *sessions) reload(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" || len(c.Value) > 64 {
		return nil
	}
	return ss.load(r.Context(), c.Value)
}

// withSession is r with its session read (get), once.
func (ss *sessions) withSession(r *http.Request) (*http.Request, *session) {
	sess := ss.reload(r)
	return r.WithContext(context.WithValue(r.Context(), sessionCtxKey{}, sess)), sess
}

// load reads the session of cookie value id: a signed-in person's (a
// record without a subject, which an earlier version stored for
// visitors, is none).
func (ss *sessions) load(ctx context.Context, id string) *session {
	ctx, cancel := context.WithTimeout(ctx, sessionOpTimeout)
	defer cancel()
	key := sessionKey(id)
	e, err := ss.kv.Get(ctx, key)
	if err != nil {
		return nil
	}
	var rec sessionRecord
	if json.Unmarshal(e.Value(), &rec) != nil || !ss.now().Before(rec.Expires) || rec.Subject == "" {
		return nil
	}
	s := &session{id: id, key: key, rev: e.Revision(), subject: rec.Subject, display: rec.Display, strong: rec.Strong,
		csrf: rec.CSRF, created: rec.Created, expires: rec.Expires}
	if before, ok := ss.revokedBefore(ctx, s.subject); !ok || !s.created.After(before) {
		return nil
	}
	return s
}

// revokedBefore is the time before which subject's sessions are revoked
// (zero when they never signed out everywhere); ok is false when it
// cannot be read.
func (ss *sessions) revokedBefore(ctx context.Context, subject string) (time.Time, bool) {
	e, err := ss.kv.Get(ctx, revokedKey(subject))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return time.Time{}, true
	case err != nil:
		return time.Time{}, false
	}
	var rec revokedRecord
	if json.Unmarshal(e.Value(), &rec) != nil {
		return time.Time{}, false
	}
	return rec.Before, true
}

// start makes a new session for subject, who has just signed in, and
// sets its cookie on w. A sign-in always starts a new session, so an id
// known before it is worth nothing after. It returns nil when the bucket
// cannot be written.
func (ss *sessions) start(ctx context.Context, w http.ResponseWriter, r *http.Request, secure bool, subject, display string, strong bool) *session {
	now := ss.now()
	s := &session{id: randomToken(), subject: subject, display: display, strong: strong, csrf: randomToken(),
		created: now, expires: now.Add(ss.ttl)}
	s.key = sessionKey(s.id)
	rec := sessionRecord{Subject: subject, Display: display, Strong: strong, CSRF: s.csrf, Created: now.UTC(), Expires: s.expires.UTC()}
	data, _ := json.Marshal(rec)
	ctx, cancel := context.WithTimeout(ctx, sessionOpTimeout)
	defer cancel()
	rev, err := ss.kv.Create(ctx, s.key, data, jetstream.KeyTTL(ss.ttl))
	if err != nil {
		return nil
	}
	s.rev = rev
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: s.id, Path: "/",
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secure || r.TLS != nil,
		Expires: s.expires,
	})
	return s
}

// end revokes session s (nil or a visitor's: none) in the bucket, for
// every process, and clears the cookie.
func (ss *sessions) end(ctx context.Context, w http.ResponseWriter, s *session) {
	if s != nil && s.key != "" {
		ctx, cancel := context.WithTimeout(ctx, sessionOpTimeout)
		defer cancel()
		_ = ss.kv.Purge(ctx, s.key, jetstream.PurgeTTL(ss.ttl))
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode})
}

// endEverywhere revokes every session of subject created up to now, in
// every browser and every process.
func (ss *sessions) endEverywhere(ctx context.Context, subject string) error {
	ctx, cancel := context.WithTimeout(ctx, sessionOpTimeout)
	defer cancel()
	data, _ := json.Marshal(revokedRecord{Before: ss.now().UTC()})
	key := revokedKey(subject)
	// Sessions live at most ttl, so the record may go after that.
	for range 3 {
		_, err := ss.kv.Create(ctx, key, data, jetstream.KeyTTL(ss.ttl+time.Minute))
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		_ = ss.kv.Purge(ctx, key, jetstream.PurgeTTL(ss.ttl))
	}
	return errors.New("web: sign-out everywhere raced: try again")
}

// validCSRF reports whether the request's csrf form value is s's token.
func validCSRF(s *session, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return s != nil && got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// current returns the request's session: the signed-in person's, else
// the visitor's from their sign-in cookie, which it sets on w when the
// request has none that is valid (a new form token; nothing is stored).
func (s *Server) current(w http.ResponseWriter, r *http.Request) *session {
	if sess := s.sessions.get(r); sess != nil {
		return sess
	}
	if v := s.visitor(r); v != nil {
		return v
	}
	now := s.cfg.Now()
	v := &session{csrf: randomToken(), created: now, expires: now.Add(signinTTL)}
	s.setVisitor(w, r, v)
	return v
}

// form returns the session a form was posted from: the signed-in
// person's, else the visitor's (nil: neither; its CSRF check fails).
func (s *Server) form(r *http.Request) *session {
	if sess := s.sessions.get(r); sess != nil {
		return sess
	}
	return s.visitor(r)
}

// signinState is a visitor's state, in their browser's sign-in cookie:
// the CSRF token of the sign-in form and, during an OIDC sign-in, its
// state, nonce and PKCE verifier. The cookie is
// base64url(JSON) "." key id "." base64url(tag): tagged with the seal
// key ring (seal.KeyRing.Tag, domain signinTagDomain), so every process
// serving the inbox reads any process's cookie and nobody can make or
// edit one; it expires signinTTL after it was made, whatever the browser
// keeps. Nothing of it is stored on the server: a visitor costs no
// write until they sign in.
type signinState struct {
	CSRF    string `json:"c"`
	Expires int64  `json:"e"` // Unix seconds
	State   string `json:"s,omitempty"`
	Nonce   string `json:"n,omitempty"`
	Verify  string `json:"v,omitempty"`
}

// visitor reads the request's sign-in cookie: nil when there is none, it
// does not verify, or it has expired.
func (s *Server) visitor(r *http.Request) *session {
	c, err := r.Cookie(signinCookie)
	if err != nil || len(c.Value) > 1024 {
		return nil
	}
	body, rest, ok1 := strings.Cut(c.Value, ".")
	keyID, tag64, ok2 := strings.Cut(rest, ".")
	msg, err1 := base64.RawURLEncoding.DecodeString(body)
	tag, err2 := base64.RawURLEncoding.DecodeString(tag64)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || !s.cfg.Keys.CheckTag(signinTagDomain, keyID, msg, tag) {
		return nil
	}
	var st signinState
	if json.Unmarshal(msg, &st) != nil || st.CSRF == "" || !s.cfg.Now().Before(time.Unix(st.Expires, 0)) {
		return nil
	}
	v := &session{csrf: st.CSRF, expires: time.Unix(st.Expires, 0)}
	if st.State != "" {
		v.login = &loginState{state: st.State, nonce: st.Nonce, verifier: st.Verify}
	}
	return v
}

// setVisitor sets v (a visitor's session) as the sign-in cookie on w.
func (s *Server) setVisitor(w http.ResponseWriter, r *http.Request, v *session) {
	st := signinState{CSRF: v.csrf, Expires: v.expires.Unix()}
	if l := v.login; l != nil {
		st.State, st.Nonce, st.Verify = l.state, l.nonce, l.verifier
	}
	msg, _ := json.Marshal(st)
	keyID, tag := s.cfg.Keys.Tag(signinTagDomain, msg)
	http.SetCookie(w, &http.Cookie{
		Name: signinCookie, Value: base64.RawURLEncoding.EncodeToString(msg) + "." + keyID + "." + base64.RawURLEncoding.EncodeToString(tag),
		Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: s.cfg.SecureCookies || r.TLS != nil, Expires: v.expires,
	})
}

// clearVisitor removes the sign-in cookie.
func clearVisitor(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: signinCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode})
}
