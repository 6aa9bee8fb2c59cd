package chat

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/tollgate-dev/tollgate/internal/httpserve"
)

// Serve is how a chat transport's process runs: its loops (the events
// consumer's Run, a Socket Mode connection) and, when ln is not nil,
// handler served on ln, until ctx ends or one of them stops. Then the
// others are cancelled and the HTTP server is shut down (within 5
// seconds). It returns the first failure, nil for a clean stop (ctx
// ended, or a loop returned nil or context.Canceled).
func Serve(ctx context.Context, handler http.Handler, ln net.Listener, loops ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(loops)+1)
	for _, run := range loops {
		go func() { errs <- run(ctx) }()
	}
	if ln != nil {
		srv := httpserve.New(handler, httpserve.Limits{}, nil)
		go func() { errs <- srv.Serve(ln) }()
		defer func() {
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			_ = srv.Shutdown(sctx)
		}()
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errs:
	}
	if first != nil && !errors.Is(first, http.ErrServerClosed) && !errors.Is(first, context.Canceled) {
		return first
	}
	return nil
}
