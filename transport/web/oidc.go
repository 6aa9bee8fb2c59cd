package web

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"slices"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/tollgate-dev/tollgate/schemas"
)

// DefaultStrongAMR are the authentication methods (the ID token's "amr"
// claim, RFC 8176) that show a second factor: a sign-in whose amr holds one
// of them is vouched for at the strong assurance. "pwd", "kba", "pin" and
// the like alone are not a second factor; "sms" and "tel" are counted
// (set OIDCConfig.StrongAMR to a shorter list to refuse them).
var DefaultStrongAMR = []string{"mfa", "mca", "otp", "hwk", "swk", "sc", "sms", "tel"}

// OIDCConfig configures sign-in with an OpenID Connect provider, by the
// authorization code flow with PKCE (S256). The principal of a person who
// signs in is web:<sub>, sub being the ID token's subject.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL; its discovery document is read
	// by New.
	Issuer       string
	ClientID     string
	ClientSecret string
	// RedirectURL is this inbox's callback as registered with the
	// provider: <the inbox's URL>/signin/oidc/callback.
	RedirectURL string
	// Scopes besides "openid" (default: profile, email).
	Scopes []string
	// StrongAMR: see DefaultStrongAMR (the default).
	StrongAMR []string
	// HTTPClient talks to the provider (default http.DefaultClient).
	HTTPClient *http.Client
}

// oidcClient is a configured relying party.
type oidcClient struct {
	oauth    oauth2.Config
	verifier *oidc.IDTokenVerifier
	strong   []string
	http     *http.Client
}

// loginState is what a sign-in in progress keeps in the browser's session:
// the state and nonce it sent and its PKCE verifier.
type loginState struct {
	state, nonce, verifier string
}

func newOIDC(ctx context.Context, c OIDCConfig) (*oidcClient, error) {
	if c.Issuer == "" || c.ClientID == "" || c.RedirectURL == "" {
		return nil, fmt.Errorf("web: OIDC needs Issuer, ClientID and RedirectURL")
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, c.HTTPClient), c.Issuer)
	if err != nil {
		return nil, fmt.Errorf("web: OIDC provider %s: %w", c.Issuer, err)
	}
	if c.Scopes == nil {
		c.Scopes = []string{"profile", "email"}
	}
	if c.StrongAMR == nil {
		c.StrongAMR = DefaultStrongAMR
	}
	return &oidcClient{
		oauth: oauth2.Config{
			ClientID: c.ClientID, ClientSecret: c.ClientSecret, RedirectURL: c.RedirectURL,
			Endpoint: p.Endpoint(), Scopes: append([]string{oidc.ScopeOpenID}, c.Scopes...),
		},
		verifier: p.Verifier(&oidc.Config{ClientID: c.ClientID}),
		strong:   c.StrongAMR,
		http:     c.HTTPClient,
	}, nil
}

// oidcStart sends the browser to the provider, with a fresh state, nonce
// and PKCE challenge kept in its sign-in cookie (signinState).
func (s *Server) oidcStart(w http.ResponseWriter, r *http.Request) {
	// The sign-in in progress is the visitor's, in their signed sign-in
	// cookie: nothing is stored, and a session the browser has goes on
	// until the sign-in completes (only POST /signout ends one early).
	v := s.visitor(r)
	now := s.cfg.Now()
	if v == nil {
		v = &session{csrf: randomToken()}
	}
	v.expires = now.Add(signinTTL)
	v.login = &loginState{state: randomToken(), nonce: randomToken(), verifier: oauth2.GenerateVerifier()}
	s.setVisitor(w, r, v)
	ls := v.login
	http.Redirect(w, r, s.oidc.oauth.AuthCodeURL(ls.state, oidc.Nonce(ls.nonce), oauth2.S256ChallengeOption(ls.verifier)), http.StatusFound)
}

// OIDC sign-in failures (shown with the page that says so).
const (
	CodeOIDCState schemas.Code = "OIDC_STATE_INVALID" // the callback's state is not the one this browser was sent with
	CodeOIDCNonce schemas.Code = "OIDC_NONCE_INVALID" // the ID token's nonce is not the one sent
	CodeOIDCToken schemas.Code = "OIDC_TOKEN_INVALID" // the code exchange or the ID token's verification failed
)

// oidcCallback finishes a sign-in: the state must be the one this
// browser's session sent (constant-time), the code is exchanged with the
// PKCE verifier, the ID token verified (signature, issuer, audience,
// expiry) and its nonce must be the one sent. Then a new session starts for
// web:<sub>, strong when the token's amr shows a second factor. The login
// state is used at most once by this browser: the callback clears the
// sign-in cookie whatever its outcome (and the provider takes a code
// once). A session the browser had ends only when the new one starts.
func (s *Server) oidcCallback(w http.ResponseWriter, r *http.Request) {
	var ls *loginState
	if v := s.visitor(r); v != nil {
		ls = v.login
	}
	clearVisitor(w)
	q := r.URL.Query()
	if ls == nil || subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(ls.state)) != 1 {
		s.message(w, r, http.StatusForbidden, "Sign-in failed", string(CodeOIDCState), "This sign-in was not started by this browser, or was already used: start again.")
		return
	}
	if e := q.Get("error"); e != "" {
		s.message(w, r, http.StatusForbidden, "Sign-in failed", string(CodeOIDCToken), "The provider refused the sign-in: "+e)
		return
	}
	ctx := oidc.ClientContext(r.Context(), s.oidc.http)
	tok, err := s.oidc.oauth.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(ls.verifier))
	if err != nil {
		s.cfg.Logger.Warn("web: OIDC code exchange failed", "err", err)
		s.message(w, r, http.StatusForbidden, "Sign-in failed", string(CodeOIDCToken), "The sign-in could not be completed: start again.")
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	id, err := s.oidc.verifier.Verify(ctx, raw)
	if err != nil {
		s.cfg.Logger.Warn("web: OIDC ID token refused", "err", err)
		s.message(w, r, http.StatusForbidden, "Sign-in failed", string(CodeOIDCToken), "The provider's ID token did not verify: start again.")
		return
	}
	if subtle.ConstantTimeCompare([]byte(id.Nonce), []byte(ls.nonce)) != 1 {
		s.message(w, r, http.StatusForbidden, "Sign-in failed", string(CodeOIDCNonce), "The ID token was not issued for this sign-in: start again.")
		return
	}
	var claims struct {
		AMR  []string `json:"amr"`
		Name string   `json:"name"`
	}
	if err := id.Claims(&claims); err != nil || id.Subject == "" {
		s.message(w, r, http.StatusForbidden, "Sign-in failed", string(CodeOIDCToken), "The ID token has no subject.")
		return
	}
	strong := slices.ContainsFunc(claims.AMR, func(m string) bool { return slices.Contains(s.oidc.strong, m) })
	s.sessions.end(r.Context(), w, s.sessions.get(r))
	if s.sessions.start(r.Context(), w, r, s.cfg.SecureCookies, id.Subject, claims.Name, strong) == nil {
		s.message(w, r, http.StatusServiceUnavailable, "Unavailable", string(CodeUnavailable), "The session could not be stored: try again.")
		return
	}
	http.Redirect(w, r, "/", http.StatusSeeOther)
}
