package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

type callFlags []schemas.ProposedCall

func (c *callFlags) String() string { return fmt.Sprint(*c) }

// Set parses "tool" or "tool={json args}".
func (c *callFlags) Set(v string) error {
	tool, args, _ := strings.Cut(v, "=")
	if tool == "" {
		return fmt.Errorf("want tool or tool={json}")
	}
	*c = append(*c, schemas.ProposedCall{Tool: tool, Args: args})
	return nil
}

// cmdSend publishes an inbound message as a chat transport would and prints
// the turn id it becomes.
func cmdSend(args []string) int {
	fs := flag.NewFlagSet("send", flag.ContinueOnError)
	var c client
	c.register(fs)
	var calls callFlags
	session := fs.String("session", "", "session id (required)")
	sender := fs.String("sender", "", "sender id on the transport (required)")
	display := fs.String("display", "", "sender display name")
	transport := fs.String("transport", "cli", "transport name")
	kind := fs.String("sender-kind", "user", "user, bot or service (only a user can answer prompts)")
	verified := fs.Bool("verified", true, "the transport verified the sender's identity")
	chKind := fs.String("channel-kind", "dm", "dm, private or public")
	chID := fs.String("channel", "", "channel id (default: dm-<sender>)")
	thread := fs.String("thread", "", "thread id")
	text := fs.String("text", "", "message text")
	msgID := fs.String("message-id", "", "transport message id (default: random); re-sending the same id is the same turn")
	fs.Var(&calls, "call", "proposed tool call, tool or tool={json args}; repeatable")
	if _, ok := parseFlags(fs, args); !ok {
		return 2
	}
	if *session == "" || *sender == "" {
		return fail("send: --session and --sender are required")
	}
	if *msgID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		*msgID = "m-" + hex.EncodeToString(b)
	}
	if *chID == "" {
		*chID = "dm-" + *sender
	}
	msg := &schemas.InboundMessage{
		Transport: *transport, MessageID: *msgID, SessionID: *session,
		Sender:  schemas.Sender{ID: *sender, Display: *display, Kind: schemas.SenderKind(*kind), Verified: *verified},
		Channel: schemas.Channel{ID: *chID, Kind: schemas.ChannelKind(*chKind), Thread: *thread},
		Text:    *text, Calls: calls, SentAt: time.Now().UTC(),
	}
	if _, err := schemas.Encode(msg); err != nil {
		return fail("send: %v", err)
	}
	if err := c.connect(); err != nil {
		return fail("send: %v", err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()
	// The message id is the dedupe key: a retried send is stored once.
	if err := bus.Publish(ctx, c.js, topology.InboundSubject(*transport, *session), *transport+":"+*msgID, msg); err != nil {
		return fail("send: %v", err)
	}
	turn := schemas.TurnID(*transport, *msgID)
	if c.json {
		printJSON(map[string]any{"turn_id": turn, "message_id": *msgID, "transport": *transport, "session_id": *session})
	} else {
		fmt.Println(turn)
	}
	return 0
}
