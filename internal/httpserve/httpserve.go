// Package httpserve builds every HTTP server Tollgate starts (the gateway
// with the web inbox, the Slack and Discord interaction endpoints, the
// metrics and health servers), so that each bounds what a client can hold:
// the time to send the headers, the whole request and the response, how
// long an idle keep-alive connection stays open, and the size of the
// headers. A handler whose response legitimately lasts longer (a
// Server-Sent Events stream, a long poll) lifts its own deadlines with
// Hold, after it has authenticated the request.
package httpserve

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// Limits are a server's timeouts and header limit. A zero field takes its
// value from Defaults.
type Limits struct {
	// ReadHeader bounds the time to read a request's headers.
	ReadHeader time.Duration
	// Read bounds the time to read a whole request, body included: a
	// client that trickles its body is cut off when it runs out.
	Read time.Duration
	// Write bounds the time from the end of the request's headers to the
	// end of the response (see Hold for longer responses).
	Write time.Duration
	// Idle is how long a keep-alive connection waits for its next request
	// before it is closed.
	Idle time.Duration
	// MaxHeaderBytes bounds the request line and headers; a larger request
	// is answered 431.
	MaxHeaderBytes int
}

// Defaults are the product's limits.
func Defaults() Limits {
	return Limits{
		ReadHeader:     10 * time.Second,
		Read:           30 * time.Second,
		Write:          60 * time.Second,
		Idle:           120 * time.Second,
		MaxHeaderBytes: 64 << 10,
	}
}

// withDefaults is l with each zero field set from Defaults.
func (l Limits) withDefaults() Limits {
	d := Defaults()
	if l.ReadHeader <= 0 {
		l.ReadHeader = d.ReadHeader
	}
	if l.Read <= 0 {
		l.Read = d.Read
	}
	if l.Write <= 0 {
		l.Write = d.Write
	}
	if l.Idle <= 0 {
		l.Idle = d.Idle
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	return l
}

// New is a server of h with limits l (zero fields: Defaults). When base is
// not nil, every request's context derives from it (it ends the requests
// held open when it is cancelled).
func New(h http.Handler, l Limits, base context.Context) *http.Server {
	l = l.withDefaults()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeader,
		ReadTimeout:       l.Read,
		WriteTimeout:      l.Write,
		IdleTimeout:       l.Idle,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
	if base != nil {
		srv.BaseContext = func(net.Listener) context.Context { return base }
	}
	return srv
}

// Hold gives the response to r (served by a server of New) another d plus
// the server's write timeout from now, for both its reads and its writes:
// a long poll calls it once with its wait, after reading the body; an
// event stream calls it with 0 before each write, so that a client that
// stops reading is cut off after one write timeout. d < 0 lifts both
// deadlines (a response held open for as long as the work it waits on).
//
// The read deadline matters even once the body is read: the server keeps
// reading the connection to notice a client that goes away, and its read
// deadline running out would cancel the request's context.
func Hold(w http.ResponseWriter, r *http.Request, d time.Duration) {
	srv, _ := r.Context().Value(http.ServerContextKey).(*http.Server)
	if srv == nil || (srv.ReadTimeout <= 0 && srv.WriteTimeout <= 0) {
		return
	}
	var until time.Time
	if d >= 0 {
		until = time.Now().Add(d + max(srv.WriteTimeout, srv.ReadTimeout))
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(until)
	_ = rc.SetWriteDeadline(until)
}

// HoldAfterBody is Hold once r's body has been read to its end (at once
// when it has none), for a handler that hands the body to code it does
// not control (the MCP SDK): a client that trickles its body is still cut
// off by the read timeout. It sets r.Body and returns r.
func HoldAfterBody(w http.ResponseWriter, r *http.Request, d time.Duration) *http.Request {
	if r.Body == nil || r.Body == http.NoBody {
		Hold(w, r, d)
		return r
	}
	r.Body = &holdBody{ReadCloser: r.Body, hold: func() { Hold(w, r, d) }}
	return r
}

// holdBody calls hold once, when its body reaches its end.
type holdBody struct {
	io.ReadCloser
	hold func()
	done bool
}

func (b *holdBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.hold()
	}
	return n, err
}
