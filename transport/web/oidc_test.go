package web_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/tollgate-dev/tollgate/transport/web"
)

// provider is a real OpenID provider (zitadel/oidc's op package, with its
// example in-memory storage) on a loopback port, whose one user, id2,
// signs in without a form. The methods (amr) and nonce of the ID tokens it
// issues can be set.
type provider struct {
	*storage.Storage
	url string

	mu    sync.Mutex
	amr   []string
	nonce string // "" : the one the relying party sent
}

func (p *provider) set(amr []string, nonce string) {
	p.mu.Lock()
	p.amr, p.nonce = amr, nonce
	p.mu.Unlock()
}

// AuthRequestByCode is the storage's, with the amr and nonce set.
func (p *provider) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	ar, err := p.Storage.AuthRequestByCode(ctx, code)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return &issued{AuthRequest: ar, amr: p.amr, nonce: p.nonce}, nil
}

type issued struct {
	op.AuthRequest
	amr   []string
	nonce string
}

func (a *issued) GetAMR() []string { return a.amr }

func (a *issued) GetNonce() string {
	if a.nonce != "" {
		return a.nonce
	}
	return a.AuthRequest.GetNonce()
}

// startProvider starts the provider with a client clientID (secret
// "secret") that may redirect to callback.
func startProvider(t *testing.T, clientID, callback string) *provider {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String()
	storage.RegisterClients(storage.WebClient(clientID, "secret", callback))
	p := &provider{Storage: storage.NewStorage(storage.NewUserStore(issuer)), url: issuer, amr: []string{"pwd"}}
	cfg := &op.Config{CryptoKey: sha256.Sum256([]byte("test")), CodeMethodS256: true}
	o, err := op.NewProvider(cfg, p, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	// The login page: user id2 (test-user2) signs in at once.
	mux.Handle("/login/username", op.NewIssuerInterceptor(o.IssuerFromRequest).HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("authRequestID")
		if err := p.CheckUsernamePassword("test-user2", "verysecure", id); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		http.Redirect(w, r, op.AuthCallbackURL(o)(r.Context(), id), http.StatusFound)
	}))
	mux.Handle("/", o)
	srv.Config.Handler = mux
	srv.Start()
	t.Cleanup(srv.Close)
	return p
}

var clientSeq atomic.Int64

// startOIDCInbox starts the inbox with OIDC sign-in against a provider of
// its own.
func startOIDCInbox(t *testing.T) (*inbox, *provider) {
	var p *provider
	in := startInbox(t, func(c *web.Config) {
		callback := "http://" + c.Addr + "/signin/oidc/callback"
		clientID := fmt.Sprintf("tollgate%d", clientSeq.Add(1))
		p = startProvider(t, clientID, callback)
		c.DevSignIn = false
		c.OIDC = &web.OIDCConfig{Issuer: p.url, ClientID: clientID, ClientSecret: "secret", RedirectURL: callback}
	})
	return in, p
}

// TestOIDCSignIn: the authorization code flow with PKCE against a real
// provider signs in web:<sub>; the strong assurance only when amr shows a
// second factor, and with it the approvals whose rule needs it; a callback
// with a state this browser did not send, a replayed callback and an ID
// token with another nonce sign nobody in.
func TestOIDCSignIn(t *testing.T) {
	in, p := startOIDCInbox(t)
	vault := in.request("carol", "vault", `{"n":1}`, true)

	for _, tc := range []struct {
		name   string
		amr    []string
		strong bool
	}{
		{"a password alone is not strong", []string{"pwd"}, false},
		{"no amr is not strong", nil, false},
		{"password and one-time code is strong", []string{"pwd", "otp"}, true},
		{"mfa is strong", []string{"mfa"}, true},
		{"a hardware key is strong", []string{"hwk"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.set(tc.amr, "")
			b := in.browser()
			resp, page := b.do("GET", "/signin/oidc", nil)
			if resp.StatusCode != http.StatusOK || !strings.Contains(page, `<strong id="principal">web:id2</strong>`) {
				t.Fatalf("%d\n%s", resp.StatusCode, page)
			}
			if got := strings.Contains(page, "(second factor)"); got != tc.strong {
				t.Fatalf("strong %v, want %v", got, tc.strong)
			}
			if got := strings.Contains(page, `id="row-`+vault.ApprovalID+`"`); got != tc.strong {
				t.Fatalf("the approval that needs a second factor listed: %v, want %v", got, tc.strong)
			}
		})
	}

	t.Run("a callback with a state this browser did not send", func(t *testing.T) {
		p.set([]string{"mfa"}, "")
		b := in.browser()
		b.c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		b.do("GET", "/signin/oidc", nil) // this browser's sign-in, abandoned
		resp, page := b.do("GET", "/signin/oidc/callback?code=x&state=forged", nil)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, string(web.CodeOIDCState)) || strings.Contains(page, "web:id2") {
			t.Fatalf("%d\n%s", resp.StatusCode, page)
		}
	})
	t.Run("a replayed callback", func(t *testing.T) {
		b := in.browser()
		var callback string
		b.c.CheckRedirect = func(r *http.Request, _ []*http.Request) error {
			if r.URL.Path == "/signin/oidc/callback" {
				callback = r.URL.String()
			}
			return nil
		}
		if resp, _ := b.do("GET", "/signin/oidc", nil); resp.StatusCode != http.StatusOK || callback == "" {
			t.Fatalf("sign-in: %d, callback %q", resp.StatusCode, callback)
		}
		attacker := in.browser()
		attacker.do("GET", "/signin", nil)
		resp, page := attacker.do("GET", strings.TrimPrefix(callback, in.url), nil)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, string(web.CodeOIDCState)) {
			t.Fatalf("%d\n%s", resp.StatusCode, page)
		}
	})
	t.Run("an ID token with another nonce", func(t *testing.T) {
		p.set([]string{"mfa"}, "nonce-of-another-sign-in")
		b := in.browser()
		resp, page := b.do("GET", "/signin/oidc", nil)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(page, string(web.CodeOIDCNonce)) || strings.Contains(page, "web:id2") {
			t.Fatalf("%d\n%s", resp.StatusCode, page)
		}
		if _, page := b.do("GET", "/", nil); strings.Contains(page, "web:id2") || strings.Contains(page, vault.ApprovalID) {
			t.Fatal("signed in after all")
		}
	})
}
