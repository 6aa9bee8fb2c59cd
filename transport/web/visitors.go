package web

import (
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxVisitorLimiters bounds the per-client limiters kept at once: past it,
// those with a full bucket (idle clients) are forgotten, and if every one
// is busy, all are.
const maxVisitorLimiters = 10000

// visitorLimits rate-limits the requests of clients that are not signed
// in, per remote IP address (the address the connection came from: a
// proxy in front of the inbox is one client).
type visitorLimits struct {
	rate  rate.Limit
	burst int

	mu sync.Mutex
	by map[string]*rate.Limiter
}

// allow reports whether the client at remoteAddr (host:port) may make one
// more request now.
func (v *visitorLimits) allow(remoteAddr string, now time.Time) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	l := v.by[host]
	if l == nil {
		if len(v.by) >= maxVisitorLimiters {
			for h, x := range v.by {
				if x.TokensAt(now) >= float64(v.burst) {
					delete(v.by, h)
				}
			}
			if len(v.by) >= maxVisitorLimiters {
				clear(v.by)
			}
		}
		l = rate.NewLimiter(v.rate, v.burst)
		v.by[host] = l
	}
	return l.AllowN(now, 1)
}

// limitVisitor answers 429 RATE_LIMITED (Tollgate-Code, Retry-After) and
// reports false when r comes from a client that is not signed in (sess
// nil) and is over the visitors' rate; static files are not counted.
func (s *Server) limitVisitor(w http.ResponseWriter, r *http.Request, sess *session) bool {
	if sess.SignedIn() || len(r.URL.Path) >= 8 && r.URL.Path[:8] == "/static/" {
		return true
	}
	if s.visitors.allow(r.RemoteAddr, time.Now()) {
		return true
	}
	w.Header().Set("Tollgate-Code", string(CodeRateLimited))
	w.Header().Set("Retry-After", "1")
	http.Error(w, string(CodeRateLimited)+": too many requests from this address before signing in: wait a moment", http.StatusTooManyRequests)
	return false
}
