package turnorder

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Lazy is a stage's one Writer, made on first use (New's stream lookup)
// and kept: a stage that is built before its stream exists, or never
// writes an order, looks nothing up until it needs to. A failed lookup
// is tried again on the next Get. The zero Lazy is not usable; make one
// with NewLazy. It is safe for concurrent use.
type Lazy struct {
	js jetstream.JetStream
	mu sync.Mutex
	w  *Writer
}

// NewLazy returns a Lazy over js.
func NewLazy(js jetstream.JetStream) *Lazy { return &Lazy{js: js} }

// Get returns the Writer, making it on the first call that succeeds.
func (l *Lazy) Get(ctx context.Context) (*Writer, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil {
		w, err := New(ctx, l.js)
		if err != nil {
			return nil, err
		}
		l.w = w
	}
	return l.w, nil
}
