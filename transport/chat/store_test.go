package chat_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

type rec struct {
	V    int    `msgpack:"v"`
	Text string `msgpack:"text"`
}

func (r *rec) RecordVersion() int { return r.V }

// Records: a create, a lost create, a compare-and-set and a lost one; a
// record of another version is refused with its code, never guessed; the
// seen records are created once and can be removed again.
func TestRecordsAndSeenMarks(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := jetstream.KeyValueConfig{Bucket: "chat_test", History: 1}
	kv, err := chat.OpenBucket(ctx, env.JS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := chat.OpenBucket(ctx, env.JS, cfg); err != nil || again.Bucket() != "chat_test" {
		t.Fatalf("binding an existing bucket: %v", err)
	}

	if got, _, err := chat.Get[rec](ctx, kv, "k", 1); got != nil || err != nil {
		t.Fatalf("absent record: %v, %v", got, err)
	}
	if err := chat.Put(ctx, kv, "k", &rec{V: 1, Text: "a"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := chat.Put(ctx, kv, "k", &rec{V: 1, Text: "b"}, 0); !errors.Is(err, chat.ErrWritten) {
		t.Errorf("second create: %v, want ErrWritten", err)
	}
	got, rev, err := chat.Get[rec](ctx, kv, "k", 1)
	if err != nil || got.Text != "a" {
		t.Fatalf("read: %+v, %v", got, err)
	}
	if err := chat.Put(ctx, kv, "k", &rec{V: 1, Text: "c"}, rev); err != nil {
		t.Fatal(err)
	}
	if err := chat.Put(ctx, kv, "k", &rec{V: 1, Text: "d"}, rev); !errors.Is(err, chat.ErrWritten) {
		t.Errorf("stale compare-and-set: %v, want ErrWritten", err)
	}
	if _, _, err := chat.Get[rec](ctx, kv, "k", 2); schemas.CodeOf(err) != schemas.CodeSchemaVersionUnsupported {
		t.Errorf("another version: %v, want %s", err, schemas.CodeSchemaVersionUnsupported)
	}

	key := chat.HashKey("seen", "a", "b")
	if key == chat.HashKey("seen", "ab") {
		t.Error("parts are not separated in the key")
	}
	for i, want := range []bool{true, false} {
		if fresh, err := chat.MarkSeen(ctx, kv, key); err != nil || fresh != want {
			t.Fatalf("mark %d: %v, %v; want %v", i, fresh, err, want)
		}
	}
	chat.Unmark(kv, key)
	if fresh, err := chat.MarkSeen(ctx, kv, key); err != nil || !fresh {
		t.Errorf("after Unmark: %v, %v", fresh, err)
	}
}

// A prompt record Slack wrote before records had message_id (its ts
// under "ts") reads with that ts as its message id, so a click on a
// prompt posted before an upgrade still binds to it.
func TestRecordReadsSlacksEarlierTS(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := chat.OpenBucket(ctx, env.JS, jetstream.KeyValueConfig{Bucket: "chat_ts"})
	if err != nil {
		t.Fatal(err)
	}
	type earlier struct {
		V       int    `msgpack:"v"`
		Channel string `msgpack:"channel"`
		TS      string `msgpack:"ts"`
		Digest  string `msgpack:"digest"`
	}
	if err := chat.Put(ctx, kv, "prompt.a-1-0", &earlier{V: 1, Channel: "C1", TS: "1700000000.000100", Digest: "d"}, 0); err != nil {
		t.Fatal(err)
	}
	r, _, err := chat.ReadRecord(ctx, kv, "prompt.a-1-0")
	if err != nil || r == nil || r.MessageID != "1700000000.000100" || r.Channel != "C1" || r.Digest != "d" {
		t.Fatalf("earlier record: %+v, %v", r, err)
	}
}
