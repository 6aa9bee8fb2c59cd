package web

import (
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Codes of a request refused by the dev inbox's DNS-rebinding guard.
const (
	// CodeHostNotLoopback: with dev sign-in, a request whose Host is not a
	// loopback name (localhost, a loopback IP such as 127.0.0.1 or [::1],
	// with or without the port).
	CodeHostNotLoopback schemas.Code = "HOST_NOT_LOOPBACK"
	// CodeOriginMismatch: with dev sign-in, a state-changing request whose
	// Origin header is present and not the inbox's own origin.
	CodeOriginMismatch schemas.Code = "ORIGIN_MISMATCH"
)

// devGuard is the DNS-rebinding guard of the dev inbox (Config.DevSignIn,
// where anyone may sign in as anyone from this machine). A page of another
// site whose name resolves to 127.0.0.1 reaches the inbox from the
// loopback address, so the socket alone proves nothing; its requests name
// that site in Host, and its cross-site posts carry that site's Origin.
// devGuard refuses, with a code and a reason, any request whose Host is
// not a loopback name, and a request that may change something (any
// method but GET, HEAD and OPTIONS) whose Origin is present and not
// http(s)://<Host>. It returns "" for a request it lets through.
func devGuard(r *http.Request) (schemas.Code, string) {
	if !loopbackHost(r.Host) {
		return CodeHostNotLoopback, fmt.Sprintf("this dev inbox answers only requests to localhost, 127.0.0.1 or [::1]; this one was for host %q (a page of another site, DNS rebinding?)", clip(r.Host))
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return "", ""
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return "", ""
	}
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
	}
	if !strings.EqualFold(origin, scheme+r.Host) {
		return CodeOriginMismatch, fmt.Sprintf("this dev inbox takes forms only from its own pages (%s); this one came from %q", scheme+r.Host, clip(origin))
	}
	return "", ""
}

// loopbackHost reports whether host (a Host header: a name or IP, with or
// without a port) is localhost or a loopback IP.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// clip bounds s for a message.
func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
