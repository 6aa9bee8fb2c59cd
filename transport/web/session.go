package web

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// cookieName names the session cookie.
const cookieName = "tollgate_session"

// anonTTL is how long a signed-out session (which only carries the CSRF
// token of the sign-in form) lives.
const anonTTL = time.Hour

// maxSessions bounds the sessions kept; past it, expired ones are dropped
// and then the oldest signed-out ones.
const maxSessions = 10000

// session is one browser's state on the server. Subject is "" while
// signed out.
type session struct {
	id      string
	subject string
	display string
	strong  bool // the sign-in showed a second factor
	csrf    string
	expires time.Time
	login   *loginState // an OIDC sign-in in progress
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

// channel is where a decision from the inbox is posted: the person's own
// inbox, which only they see (a personal channel).
func (s *session) channel() *schemas.Channel {
	return &schemas.Channel{ID: "inbox-" + s.subject, Kind: schemas.ChannelDM}
}

// sessions is the server-side session table. A cookie names a session by
// id and an HMAC of the id: a cookie whose MAC does not verify, whose
// session is unknown (signed out, forgotten at restart) or past its expiry
// is no session.
type sessions struct {
	key []byte
	ttl time.Duration
	now func() time.Time

	mu sync.Mutex
	m  map[string]*session
}

func newSessions(key []byte, ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{key: key, ttl: ttl, now: now, m: map[string]*session{}}
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (ss *sessions) mac(id string) string {
	m := hmac.New(sha256.New, ss.key)
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// get returns the request's live session, or nil.
func (ss *sessions) get(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	id, mac, ok := strings.Cut(c.Value, ".")
	if !ok || !hmac.Equal([]byte(mac), []byte(ss.mac(id))) {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	if s == nil {
		return nil
	}
	if !ss.now().Before(s.expires) {
		delete(ss.m, id)
		return nil
	}
	cp := *s
	return &cp
}

// start makes a new session for subject ("" for a signed-out one, to carry
// a CSRF token) and sets its cookie on w. A sign-in always starts a new
// session, so an id known before it is worth nothing after.
func (ss *sessions) start(w http.ResponseWriter, r *http.Request, secure bool, subject, display string, strong bool) *session {
	ttl := ss.ttl
	if subject == "" {
		ttl = anonTTL
	}
	s := &session{id: randomToken(), subject: subject, display: display, strong: strong, csrf: randomToken(), expires: ss.now().Add(ttl)}
	ss.mu.Lock()
	if len(ss.m) >= maxSessions {
		ss.prune()
	}
	ss.m[s.id] = s
	ss.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: s.id + "." + ss.mac(s.id), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secure || r.TLS != nil,
		Expires: s.expires,
	})
	cp := *s
	return &cp
}

// prune drops expired sessions and, if that is not enough, signed-out
// ones; ss.mu is held.
func (ss *sessions) prune() {
	now := ss.now()
	for id, s := range ss.m {
		if !now.Before(s.expires) {
			delete(ss.m, id)
		}
	}
	for id, s := range ss.m {
		if len(ss.m) < maxSessions {
			return
		}
		if s.subject == "" {
			delete(ss.m, id)
		}
	}
}

// end forgets session id and clears the cookie.
func (ss *sessions) end(w http.ResponseWriter, id string) {
	ss.mu.Lock()
	delete(ss.m, id)
	ss.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode})
}

// setLogin keeps ls in session id, for the OIDC callback.
func (ss *sessions) setLogin(id string, ls *loginState) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.m[id]; s != nil {
		s.login = ls
	}
}

// takeLogin returns and forgets the sign-in in progress of session id.
func (ss *sessions) takeLogin(id string) *loginState {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	if s == nil {
		return nil
	}
	ls := s.login
	s.login = nil
	return ls
}

// validCSRF reports whether the request's csrf form value is s's token.
func validCSRF(s *session, r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return s != nil && got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// current returns the request's session, starting a signed-out one (for
// the CSRF token of forms) when there is none.
func (s *Server) current(w http.ResponseWriter, r *http.Request) *session {
	if sess := s.sessions.get(r); sess != nil {
		return sess
	}
	return s.sessions.start(w, r, s.cfg.SecureCookies, "", "", false)
}
