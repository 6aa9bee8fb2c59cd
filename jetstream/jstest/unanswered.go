package jstest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Unanswered makes stream stop taking its subjects (it keeps only one that
// nothing publishes to) and a subscriber on subject hear every publish
// there (sent on heard) and answer nothing, so that a JetStream publish on
// subject gets no acknowledgement, as one reaching a stream leader that
// loses its leadership can on a cluster. restore gives the stream its
// configuration back, as the next leader takes the subjects; it runs at
// the test's end too, and only once.
func Unanswered(t testing.TB, env *Env, stream, subject string) (heard <-chan *nats.Msg, restore func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := env.JS.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	deaf := cfg
	deaf.Subjects = []string{"jstest.unanswered." + stream}
	if _, err := env.JS.UpdateStream(ctx, deaf); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *nats.Msg, 64)
	sub, err := env.NC.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			_ = sub.Unsubscribe()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := env.JS.UpdateStream(ctx, cfg); err != nil {
				t.Errorf("restore %s: %v", stream, err)
			}
		})
	}
	t.Cleanup(restore)
	return ch, restore
}
