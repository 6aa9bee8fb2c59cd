package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// serveGateway runs the test gateway's Serve (the server the product
// starts) with short HTTP limits and returns its address.
func serveGateway(t *testing.T, l httpserve.Limits) (*gw, string) {
	t.Helper()
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) {
		c.HTTP = l
		c.Heartbeat = 100 * time.Millisecond
		c.MaxWait = 5 * time.Second
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return g, ln.Addr().String()
}

var shortLimits = httpserve.Limits{ReadHeader: 300 * time.Millisecond, Read: 500 * time.Millisecond, Write: 500 * time.Millisecond, Idle: 500 * time.Millisecond}

// TestGatewayCutsOffSlowAndIdleClients: an unauthenticated client that
// sends its headers and trickles its body is disconnected, and so is an
// idle keep-alive connection; nothing was submitted.
func TestGatewayCutsOffSlowAndIdleClients(t *testing.T) {
	g, addr := serveGateway(t, shortLimits)

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow, "POST /v1/turns HTTP/1.1\r\nHost: "+addr+"\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	cut := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, slow); close(cut) }()
	sent := 0
	jstest.EventuallyState(t, jstest.Wait, "a client trickling its body is cut off (read timeout 500ms)", func() (bool, string) {
		select {
		case <-cut:
			return true, ""
		default:
		}
		if _, err := slow.Write([]byte(" ")); err == nil {
			sent++
		}
		return false, fmt.Sprintf("still connected, %d bytes of the body trickled", sent)
	})

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.Copy(io.Discard, idle)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("an idle keep-alive connection was still open after 5s (idle timeout 500ms)")
	}
	if n := g.count(topology.StreamInbound, "tollgate.inbound.>"); n != 0 {
		t.Fatalf("%d turns stored; want none", n)
	}
}

// TestGatewayHoldsStreamsAndLongPolls: an event stream keeps receiving
// heartbeats long past the write timeout, and a long poll answers after
// its wait, though both outlast the server's read and write timeouts.
func TestGatewayHoldsStreamsAndLongPolls(t *testing.T) {
	g, addr := serveGateway(t, shortLimits)
	get := func(path string) *http.Response {
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+g.tokens["a"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := get("/v1/events?session=held")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: status %d", resp.StatusCode)
	}
	start, beats := time.Now(), 0
	sc := bufio.NewScanner(resp.Body)
	for time.Since(start) < 2*time.Second && sc.Scan() {
		if strings.HasPrefix(sc.Text(), ": heartbeat") {
			beats++
		}
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Fatalf("the event stream ended after %v (%d heartbeats, err %v); want it held past the 500ms timeouts", took, beats, sc.Err())
	}

	start = time.Now()
	poll := get("/v1/turns/no-such-turn?wait=1500ms")
	_, err := io.ReadAll(poll.Body)
	poll.Body.Close()
	if err != nil || poll.StatusCode != http.StatusNotFound || time.Since(start) < 1500*time.Millisecond {
		t.Fatalf("long poll: status %d, err %v after %v; want 404 once the 1.5s wait ran out", poll.StatusCode, err, time.Since(start))
	}
}
