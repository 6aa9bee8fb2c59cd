package jstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

// TestCaughtUpWaitsForTheAckFloor: a consumer is caught up only once it
// has acknowledged the last message its filter matches; a message on a
// subject it does not read does not hold it back.
func TestCaughtUpWaitsForTheAckFloor(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "CU", Subjects: []string{"cu.>"}}); err != nil {
		t.Fatal(err)
	}
	c, err := env.JS.CreateConsumer(ctx, "CU", jetstream.ConsumerConfig{Durable: "reader", FilterSubject: "cu.read", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if ok, state := jstest.CaughtUp(ctx, env.JS, "CU", "reader"); !ok {
		t.Fatalf("an empty stream: not caught up (%s)", state)
	}
	if _, err := env.JS.Publish(ctx, "cu.read", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if ok, state := jstest.CaughtUp(ctx, env.JS, "CU", "reader"); ok {
		t.Fatalf("caught up before reading its message (%s)", state)
	}
	msgs, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range msgs.Messages() {
		if ok, state := jstest.CaughtUp(ctx, env.JS, "CU", "reader"); ok {
			t.Fatalf("caught up with its message unacknowledged (%s)", state)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.JS.Publish(ctx, "cu.other", []byte("2")); err != nil {
		t.Fatal(err)
	}
	jstest.EventuallyState(t, jstest.Wait, "caught up after the ack", func() (bool, string) {
		return jstest.CaughtUp(ctx, env.JS, "CU", "reader")
	})
}
