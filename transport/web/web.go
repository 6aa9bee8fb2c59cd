// Package web is Tollgate's web approval inbox: a transport, named "web",
// through which a signed-in person sees the pending approvals they may
// decide, with the exact call in front of them, and approves or denies
// them. It is an http.Handler that the HTTP gateway mounts at "/"
// (transport/gateway Config.Web).
//
// The inbox never widens what the approver allows. The list of approvals a
// person sees is computed with policy.Policy.MayDecideApproval, the decider rule the
// approver itself applies, on the same inputs the approver will get (the
// decision's transport "web", the decider web:<subject> at the assurance
// the sign-in vouched for, and the inbox channel, a personal one); the
// approver still checks every decision against the persisted record.
//
// Standing grants (docs/protocol.md, "Grants"): a card shows each grant
// option the approval offers as a button of its own, with the offer's
// summary (what it would cover, for how long), in the same form as
// approve and deny (same digest, same CSRF token, same decision path).
// The Grants page lists the grants the signed-in person may revoke: those
// they made, and those on a turn whose tool the approver's decider rule
// lets them decide (whoever could have made a grant may end it; revoking
// only narrows; policy.Policy.MayRevokeGrant). Revoke publishes a revocation request
// (a Decision on the grant, option "revoke") that the approver carries out
// (approver.RevokeGrant: the record is marked revoked and grant.revoked is
// published, naming web:<subject>): the inbox only reads the grants bucket.
//
// Pages are server-rendered with html/template (which does all escaping);
// the only script is static/inbox.js, served from this package. Every
// response carries a Content-Security-Policy without inline script and
// with frame-ancestors 'none'. Sessions of people who signed in are kept
// in the KV bucket tollgate_web_sessions (by the hash of their id, with a
// TTL), so a restart keeps people signed in and any replica serves any
// request; a random id in an HttpOnly, SameSite=Lax cookie (Secure under
// TLS) names one; every state-changing request carries the session's CSRF
// token. A visitor who has not signed in writes nothing: the sign-in
// form's token and an OIDC sign-in in progress are in a short-lived
// cookie tagged with the seal key ring; such visitors are rate-limited by
// address; only POST /signout ends a session.
package web

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
)

// Transport is the transport name of the inbox: decisions are published on
// tollgate.decision.submit.web.<approval id> with principal web:<subject>.
const Transport = "web"

// ErrDevSignInNotLoopback: dev sign-in (anyone picks any principal) was
// asked for on an address that is not a loopback one.
var ErrDevSignInNotLoopback = errors.New("web: dev sign-in is allowed only on a loopback address (127.0.0.1, ::1 or localhost)")

//go:embed templates/*.html static/*
var assets embed.FS

// Config wires a Server.
type Config struct {
	// JS is the connection the inbox reads and publishes with.
	JS jetstream.JetStream
	// Policy and Keys are the approver's: the inbox lists an approval to a
	// person only when policy.Policy.MayDecideApproval accepts them under these.
	Policy *policy.Policy
	Keys   *seal.KeyRing
	Logger *slog.Logger

	// Addr is the address the server that mounts the inbox listens on. It
	// must be a loopback address when DevSignIn is set.
	Addr string
	// DevSignIn enables the local sign-in form where anyone picks a
	// principal: for `tollgate dev` only. New refuses it unless Addr is a
	// loopback address, and the form itself answers only requests that
	// arrived on a loopback address from one. Every request must then name
	// a loopback host, and a state-changing one carry no Origin but the
	// inbox's own (devGuard: DNS rebinding).
	DevSignIn bool
	// OIDC, when set, enables sign-in with an OpenID Connect provider.
	OIDC *OIDCConfig
	// SessionTTL is how long a sign-in lasts (default 8h); the server
	// forgets the session then, whatever the cookie says. Sessions live in
	// the KV bucket tollgate_web_sessions (topology.BucketWebSessions),
	// shared by every process that serves the inbox.
	SessionTTL time.Duration
	// SecureCookies marks cookies Secure even on plain-HTTP requests (behind
	// a TLS-terminating proxy). Requests that arrive over TLS always get
	// Secure cookies.
	SecureCookies bool

	// DecisionRate and DecisionBurst bound the decisions of one principal
	// (default 1/s, burst 5); more are refused 429 RATE_LIMITED.
	DecisionRate  rate.Limit
	DecisionBurst int
	// VisitorRate and VisitorBurst bound the requests of one client (by
	// remote IP address) that is not signed in (default 10/s, burst 50;
	// static files are not counted); more are refused 429 RATE_LIMITED.
	// rate.Inf turns the limit off.
	VisitorRate  rate.Limit
	VisitorBurst int
	// DecisionWait is how long a decision waits for the approver's verdict
	// (default 10s) before the page says it was submitted.
	DecisionWait time.Duration
	// Heartbeat is the interval of SSE heartbeat comments (default 15s);
	// each also checks that the session still exists.
	Heartbeat time.Duration
	// MaxStreams caps the live streams (/events) one person holds open at
	// once in this process (default 8); one more is refused 429
	// TOO_MANY_STREAMS.
	MaxStreams int
	// Events is the process's event feed, which serves every live stream
	// from one consumer of TOLLGATE_EVENTS; share the gateway's (nil: the
	// server makes its own).
	Events *eventfeed.Feed
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Server is the inbox's http.Handler.
type Server struct {
	cfg      Config
	store    *store.Store
	feed     *eventfeed.Feed
	sessions *sessions
	pages    map[string]*template.Template
	mux      *http.ServeMux
	oidc     *oidcClient // nil: no OIDC sign-in
	index    *pendingIndex

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // by principal
	visitors visitorLimits
}

// LoopbackAddr reports whether addr (host:port) names a loopback host:
// a loopback IP or "localhost".
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// New checks cfg, binds to the pipeline's events stream and buckets (which
// must exist) and returns the inbox. With DevSignIn on an Addr that is not
// a loopback address it fails with ErrDevSignInNotLoopback.
func New(cfg Config) (*Server, error) {
	if cfg.JS == nil || cfg.Policy == nil || cfg.Keys == nil || cfg.Logger == nil {
		return nil, errors.New("web: JS, Policy, Keys and Logger are required")
	}
	if cfg.DevSignIn && !LoopbackAddr(cfg.Addr) {
		return nil, fmt.Errorf("%w: got %q", ErrDevSignInNotLoopback, cfg.Addr)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 8 * time.Hour
	}
	if cfg.DecisionRate == 0 {
		cfg.DecisionRate, cfg.DecisionBurst = 1, 5
	}
	if cfg.DecisionBurst <= 0 {
		cfg.DecisionBurst = 1
	}
	if cfg.VisitorRate == 0 {
		cfg.VisitorRate, cfg.VisitorBurst = 10, 50
	}
	if cfg.VisitorBurst <= 0 {
		cfg.VisitorBurst = 1
	}
	if cfg.DecisionWait <= 0 {
		cfg.DecisionWait = 10 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 8
	}
	if cfg.Events == nil {
		cfg.Events = eventfeed.New(cfg.JS, cfg.Logger)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := topology.OpenBuckets(ctx, cfg.JS)
	if err != nil {
		return nil, err
	}
	sessKV, err := cfg.JS.KeyValue(ctx, topology.BucketWebSessions)
	if err != nil {
		return nil, fmt.Errorf("web: bucket %s: %w", topology.BucketWebSessions, err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, store: store.New(b), feed: cfg.Events, pages: pages,
		sessions: newSessions(sessKV, cfg.SessionTTL, cfg.Now),
		limiters: map[string]*rate.Limiter{},
		visitors: visitorLimits{rate: cfg.VisitorRate, burst: cfg.VisitorBurst, by: map[string]*rate.Limiter{}},
	}
	if cfg.OIDC != nil {
		if s.oidc, err = newOIDC(ctx, *cfg.OIDC); err != nil {
			return nil, err
		}
	}
	if s.index, err = startPendingIndex(ctx, b.Approvals, s.store.Approvals.DecodeValue, cfg.Logger); err != nil {
		return nil, err
	}
	s.mux = http.NewServeMux()
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	static, _ := fs.Sub(assets, "static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.inbox)
	s.mux.HandleFunc("GET /signin", s.signInPage)
	s.mux.HandleFunc("POST /signin/dev", s.devSignIn)
	s.mux.HandleFunc("POST /signout", s.signOut)
	s.mux.HandleFunc("GET /session", s.sessionState)
	s.mux.HandleFunc("GET /approvals/{id}", s.approval)
	s.mux.HandleFunc("POST /approvals/{id}/decision", s.decide)
	s.mux.HandleFunc("GET /events", s.live)
	s.mux.HandleFunc("GET /turns/{id}", s.turn)
	s.mux.HandleFunc("GET /history", s.history)
	s.mux.HandleFunc("GET /history.jsonl", s.export)
	s.mux.HandleFunc("GET /grants", s.grantsPage)
	s.mux.HandleFunc("POST /grants/{id}/revoke", s.revokeGrant)
	if s.oidc != nil {
		s.mux.HandleFunc("GET /signin/oidc", s.oidcStart)
		s.mux.HandleFunc("GET /signin/oidc/callback", s.oidcCallback)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.render(w, r, http.StatusNotFound, "message", page{Title: "Not found", Message: "There is no page " + r.URL.Path + "."})
	})
}

// ServeHTTP sets the security headers and serves the inbox; with
// DevSignIn it first refuses what devGuard refuses (403, the code in
// Tollgate-Code), so that nothing is read, signed in or decided.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: no referrer goes to another site, and
	// the inbox's own posts carry its Origin (no-referrer makes a browser
	// send "Origin: null"), which devGuard checks.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.TLS != nil {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if s.cfg.DevSignIn {
		if code, msg := devGuard(r); code != "" {
			h.Set("Tollgate-Code", string(code))
			http.Error(w, string(code)+": "+msg, http.StatusForbidden)
			return
		}
	}
	// The session is read once per request; a client that is not signed
	// in is rate-limited by address.
	r, sess := s.sessions.withSession(r)
	if !s.limitVisitor(w, r, sess) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Close stops the server's watch of the approvals bucket (it also ends
// when the connection closes). Requests are not served after it.
func (s *Server) Close() error { return s.index.Stop() }

// limiter is principal's decision rate limiter.
func (s *Server) limiter(principal string) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limiters[principal]
	if l == nil {
		l = rate.NewLimiter(s.cfg.DecisionRate, s.cfg.DecisionBurst)
		s.limiters[principal] = l
	}
	return l
}
