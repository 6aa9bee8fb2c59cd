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
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/schemas"
)

// cookieName names the session cookie.
const cookieName = "tollgate_session"

// anonTTL is how long a signed-out session (which only carries the CSRF
// token of the sign-in form) lives.
const anonTTL = time.Hour

// sessionOpTimeout bounds one read or write of the sessions bucket.
const sessionOpTimeout = 5 * time.Second

// session is one browser's state on the server. Subject is "" while
// signed out.
type session struct {
	id      string // the cookie's value; never stored
	key     string // the bucket key: "s." + hex(SHA-256(id))
	rev     uint64 // the record's revision
	subject string
	display string
	strong  bool // the sign-in showed a second factor
	csrf    string
	created time.Time
	expires time.Time
	login   *loginState // an OIDC sign-in in progress
}

// sessionRecord is a session as stored in the sessions bucket.
type sessionRecord struct {
	Subject string       `json:"subject,omitempty"`
	Display string       `json:"display,omitempty"`
	Strong  bool         `json:"strong,omitempty"`
	CSRF    string       `json:"csrf"`
	Created time.Time    `json:"created"`
	Expires time.Time    `json:"expires"`
	Login   *loginRecord `json:"login,omitempty"`
}

// loginRecord is a loginState as stored.
type loginRecord struct {
	State    string `json:"state"`
	Nonce    string `json:"nonce"`
	Verifier string `json:"verifier"`
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

// get returns the request's live session, or nil: no cookie, no record,
// a record past its expiry, one created before its person signed out
// everywhere, or the bucket unreachable.
func (ss *sessions) get(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" || len(c.Value) > 64 {
		return nil
	}
	return ss.load(r.Context(), c.Value)
}

// load reads the session of cookie value id.
func (ss *sessions) load(ctx context.Context, id string) *session {
	ctx, cancel := context.WithTimeout(ctx, sessionOpTimeout)
	defer cancel()
	key := sessionKey(id)
	e, err := ss.kv.Get(ctx, key)
	if err != nil {
		return nil
	}
	var rec sessionRecord
	if json.Unmarshal(e.Value(), &rec) != nil || !ss.now().Before(rec.Expires) {
		return nil
	}
	s := &session{id: id, key: key, rev: e.Revision(), subject: rec.Subject, display: rec.Display, strong: rec.Strong,
		csrf: rec.CSRF, created: rec.Created, expires: rec.Expires}
	if l := rec.Login; l != nil {
		s.login = &loginState{state: l.State, nonce: l.Nonce, verifier: l.Verifier}
	}
	if s.subject != "" {
		if before, ok := ss.revokedBefore(ctx, s.subject); !ok || !s.created.After(before) {
			return nil
		}
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

// start makes a new session for subject ("" for a signed-out one, to carry
// a CSRF token, and login, an OIDC sign-in in progress) and sets its
// cookie on w. A sign-in always starts a new session, so an id known
// before it is worth nothing after. It returns nil when the bucket cannot
// be written.
func (ss *sessions) start(ctx context.Context, w http.ResponseWriter, r *http.Request, secure bool, subject, display string, strong bool, login *loginState) *session {
	ttl := ss.ttl
	if subject == "" {
		ttl = anonTTL
	}
	now := ss.now()
	s := &session{id: randomToken(), subject: subject, display: display, strong: strong, csrf: randomToken(),
		created: now, expires: now.Add(ttl), login: login}
	s.key = sessionKey(s.id)
	rec := sessionRecord{Subject: subject, Display: display, Strong: strong, CSRF: s.csrf, Created: now.UTC(), Expires: s.expires.UTC()}
	if login != nil {
		rec.Login = &loginRecord{State: login.state, Nonce: login.nonce, Verifier: login.verifier}
	}
	data, _ := json.Marshal(rec)
	ctx, cancel := context.WithTimeout(ctx, sessionOpTimeout)
	defer cancel()
	rev, err := ss.kv.Create(ctx, s.key, data, jetstream.KeyTTL(ttl))
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

// end revokes session s (nil: none) in the bucket, for every process, and
// clears the cookie.
func (ss *sessions) end(ctx context.Context, w http.ResponseWriter, s *session) {
	if s != nil {
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

// takeLogin returns and forgets the sign-in in progress of s: at most
// once, whichever process asks (the record is purged only if it is still
// the revision read).
func (ss *sessions) takeLogin(ctx context.Context, s *session) *loginState {
	if s == nil || s.login == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, sessionOpTimeout)
	defer cancel()
	if err := ss.kv.Purge(ctx, s.key, jetstream.LastRevision(s.rev), jetstream.PurgeTTL(ss.ttl)); err != nil {
		return nil
	}
	return s.login
}

// validCSRF reports whether the request's csrf form value is s's token.
func validCSRF(s *session, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return s != nil && got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// current returns the request's session, starting a signed-out one (for
// the CSRF token of forms) when there is none. It is nil only when the
// sessions bucket cannot be written.
func (s *Server) current(w http.ResponseWriter, r *http.Request) *session {
	if sess := s.sessions.get(r); sess != nil {
		return sess
	}
	return s.sessions.start(r.Context(), w, r, s.cfg.SecureCookies, "", "", false, nil)
}
