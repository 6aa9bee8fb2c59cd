package chat_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Serve runs the loops and the HTTP server until one loop fails (its
// error is returned, the others are cancelled) or ctx ends (nil); either
// way the server is shut down.
func TestServeStopsEverythingOnTheFirstFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	fail := make(chan struct{})
	cancelled := make(chan struct{})
	boom := errors.New("boom")
	done := make(chan error, 1)
	go func() {
		done <- chat.Serve(context.Background(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}), ln,
			func(ctx context.Context) error { <-fail; return boom },
			func(ctx context.Context) error { <-ctx.Done(); close(cancelled); return ctx.Err() })
	}()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("the server does not answer: %v", err)
	}
	resp.Body.Close()
	close(fail)
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Errorf("Serve: %v, want the loop's failure", err)
		}
	case <-jstest.After(jstest.Wait):
		t.Fatal("Serve did not return after a loop failed")
	}
	select {
	case <-cancelled:
	case <-jstest.After(jstest.Wait):
		t.Fatal("the other loop was not cancelled")
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the HTTP server still listens after Serve returned")
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		done <- chat.Serve(ctx, nil, nil, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	}()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after ctx ended: %v, want nil", err)
		}
	case <-jstest.After(jstest.Wait):
		t.Fatal("Serve did not return after ctx ended")
	}
}
