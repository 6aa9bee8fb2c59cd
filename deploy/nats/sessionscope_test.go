package natsconf_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/schemas"
)

// On the least-privilege bus a transport may publish only on its own
// inbound subjects, but it chooses the session id. The slack user sending
// the cli user's session id gets a session of the slack transport
// (security rule 12): its turn is not queued in the cli user's session,
// which keeps its waiting turn active and nothing queued.
func TestLeastPrivilegeATransportCannotQueueInAnotherTransportsSession(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	_, stop := runStages(t, ns, filepath.Join(t.TempDir(), "sandbox"))
	defer stop()
	cli, slack := dial(t, ns, "cli"), dial(t, ns, "slack")
	kv, err := topology.OpenBuckets(ctx(t, wait), admin.js)
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(kv)
	const session = "alice-cli-session"
	victim := send(t, cli, "m-victim", session, schemas.ProposedCall{Tool: "write_file", Args: `{"path":"v.txt","content":"alice"}`})
	eventually(t, "the cli turn waits for alice", func(c context.Context) bool {
		b, _, err := st.Batches.Get(c, victim)
		return err == nil && b.State == schemas.BatchAwaiting
	})

	msg := &schemas.InboundMessage{
		Transport: "slack", MessageID: "m-intruder", SessionID: session,
		Sender:  schemas.Sender{ID: "U-mallory", Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: "D-mallory", Kind: schemas.ChannelDM},
		Text:    "hi", Calls: []schemas.ProposedCall{{Tool: "echo", Args: `{"text":"in your session"}`}}, SentAt: time.Now().UTC(),
	}
	publish(t, slack, topology.InboundSubject("slack", session), "slack:m-intruder", msg)
	intruder := schemas.TurnID("slack", "m-intruder")
	eventually(t, "the slack turn completes in a session of its own", func(c context.Context) bool {
		b, _, err := st.Batches.Get(c, intruder)
		return err == nil && b.State == schemas.BatchCompleted
	})
	if b, _, err := st.Batches.Get(ctx(t, wait), intruder); err != nil || b.OrderAfter != "" || b.OrderSeq == 0 {
		t.Fatalf("slack turn %+v (%v), want the first entry of its own session's order", b, err)
	}
	if b, _, err := st.Batches.Get(ctx(t, wait), victim); err != nil || b.State != schemas.BatchAwaiting {
		t.Fatalf("cli turn %+v (%v), want still awaiting alice", b, err)
	}
}
