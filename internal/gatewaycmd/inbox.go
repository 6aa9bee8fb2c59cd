package gatewaycmd

import (
	"flag"
	"log/slog"
	"net/http"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/seal"
	"github.com/tollgate-dev/tollgate/transport/eventfeed"
	"github.com/tollgate-dev/tollgate/transport/web"
)

// inboxFlags configure the web approval inbox (transport/web), served at /
// with OpenID Connect sign-in when --oidc-issuer is given.
type inboxFlags struct {
	issuer, clientID, redirect, sealKeys string
	insecureCookies                      bool
}

func (f *inboxFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.issuer, "oidc-issuer", scaffold.Env("TOLLGATE_OIDC_ISSUER", ""), "OpenID provider issuer URL: serves the web approval inbox at / with OIDC sign-in; empty for no inbox (env TOLLGATE_OIDC_ISSUER; client secret in env TOLLGATE_OIDC_CLIENT_SECRET; see docs/inbox.md)")
	fs.StringVar(&f.clientID, "oidc-client-id", scaffold.Env("TOLLGATE_OIDC_CLIENT_ID", ""), "the inbox's OIDC client id (env TOLLGATE_OIDC_CLIENT_ID)")
	fs.StringVar(&f.redirect, "oidc-redirect-url", scaffold.Env("TOLLGATE_OIDC_REDIRECT_URL", ""), "the inbox's callback as registered with the provider, https://<host>/signin/oidc/callback (env TOLLGATE_OIDC_REDIRECT_URL)")
	fs.StringVar(&f.sealKeys, "seal-keys", "", "TurnContext seal key file, which the inbox verifies approvals with (default: env TOLLGATE_SEAL_KEYS or TOLLGATE_SEAL_KEY_FILE)")
	fs.BoolVar(&f.insecureCookies, "insecure-cookies", false, "session cookies without Secure, for an inbox served over plain HTTP (by default they are Secure: serve it behind TLS)")
}

// handler builds the inbox, or returns nil when --oidc-issuer is not set.
func (f *inboxFlags) handler(js jetstream.JetStream, pol *policy.Policy, addr string, log *slog.Logger, events *eventfeed.Feed, maxStreams int) (http.Handler, error) {
	if f.issuer == "" {
		return nil, nil
	}
	keys, err := seal.FromEnv(f.sealKeys)
	if err != nil {
		return nil, err
	}
	return web.New(web.Config{
		JS: js, Policy: pol, Keys: keys, Logger: log, Addr: addr, SecureCookies: !f.insecureCookies,
		Events: events, MaxStreams: maxStreams,
		OIDC: &web.OIDCConfig{Issuer: f.issuer, ClientID: f.clientID, ClientSecret: os.Getenv("TOLLGATE_OIDC_CLIENT_SECRET"), RedirectURL: f.redirect},
	})
}
