package httpserve

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve starts a server of New(h, l) on a loopback port and returns its
// address.
func serve(t *testing.T, h http.Handler, l Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(h, l, context.Background())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// closedWithin reports whether the server closes c (a read gets EOF or a
// reset, not this side's deadline) within d, discarding what it sends.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

var short = Limits{ReadHeader: 300 * time.Millisecond, Read: 500 * time.Millisecond, Write: 500 * time.Millisecond, Idle: 500 * time.Millisecond, MaxHeaderBytes: 4 << 10}

// TestSlowBodyIsCutOff: a client that sends its headers and then trickles
// its body is disconnected once the read timeout runs out, though it keeps
// sending.
func TestSlowBodyIsCutOff(t *testing.T) {
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}), short)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cut, took := trickle(t, c, 5*time.Second)
	if !cut {
		t.Fatal("a client trickling its body still connected after 5s (read timeout 500ms)")
	}
	if took < short.Read/2 {
		t.Fatalf("cut off after %v, before the read timeout", took)
	}
}

// trickle sends a request's headers on c announcing a long body, then one
// byte of it every 50ms, and reports whether the server cut c off within
// d, and after how long.
func trickle(t *testing.T, c net.Conn, d time.Duration) (bool, time.Duration) {
	t.Helper()
	if _, err := io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, c); close(cut) }()
	start := time.Now()
	for {
		select {
		case <-cut:
			return true, time.Since(start)
		case <-time.After(50 * time.Millisecond):
			if time.Since(start) > d {
				return false, time.Since(start)
			}
			_, _ = c.Write([]byte("x"))
		}
	}
}

// TestIdleKeepAliveIsClosed: a keep-alive connection that sends no next
// request is closed after the idle timeout.
func TestIdleKeepAliveIsClosed(t *testing.T) {
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }), short)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Close {
		t.Fatal("the server closed the connection after the first request; want keep-alive")
	}
	if !closedWithin(c, 5*time.Second) {
		t.Fatal("an idle keep-alive connection still open after 5s (idle timeout 500ms)")
	}
}

// TestHugeHeadersRefused: headers over MaxHeaderBytes are answered 431.
func TestHugeHeadersRefused(t *testing.T) {
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), short)
	req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 64<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
}

// TestHoldKeepsALongPoll: a handler that holds its response lives past the
// read and write timeouts, with its context intact, and its answer
// arrives; without Hold the same handler's context is cancelled.
func TestHoldKeepsALongPoll(t *testing.T) {
	for _, hold := range []bool{true, false} {
		ctxErr := make(chan error, 1)
		addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hold {
				Hold(w, r, 2*time.Second)
			}
			select {
			case <-r.Context().Done():
				ctxErr <- r.Context().Err()
				return
			case <-time.After(1200 * time.Millisecond): // over Read and Write
			}
			ctxErr <- nil
			_, _ = io.WriteString(w, "done")
		}), short)
		resp, err := http.Get("http://" + addr + "/")
		var body []byte
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		got := <-ctxErr
		if hold && (got != nil || string(body) != "done") {
			t.Fatalf("held: context %v, body %q (err %v); want the answer", got, body, err)
		}
		if !hold && got == nil && string(body) == "done" {
			t.Fatal("without Hold the long poll outlived the timeouts; the test proves nothing")
		}
	}
}

// TestHoldAfterBody: a handler that holds its response once the body is
// read still cuts off a client that trickles its body, and answers a
// client that sent its body after a wait past the timeouts.
func TestHoldAfterBody(t *testing.T) {
	addr := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = HoldAfterBody(w, r, -1)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(1200 * time.Millisecond):
		}
		_, _ = io.WriteString(w, "done")
	}), short)
	resp, err := http.Post("http://"+addr+"/", "text/plain", strings.NewReader("a body"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "done" {
		t.Fatalf("after the body: %q; want the held answer", body)
	}

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if cut, _ := trickle(t, c, 5*time.Second); !cut {
		t.Fatal("a client trickling its body to a held handler still connected after 5s (read timeout 500ms)")
	}
}
