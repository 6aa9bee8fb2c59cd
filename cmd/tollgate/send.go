package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/pipeline/ingest"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

var sendCmd = &command{
	name:    "send",
	args:    "--session ID --sender ID [--call TOOL[={JSON}]]...",
	summary: "publish a chat message with proposed tool calls, as a transport would; prints the turn id",
	example: `tollgate send --session demo --sender alice --call 'write_file={"path":"hello.txt","content":"hi"}'`,
	run:     cmdSend,
}

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
// the turn id it becomes. The message is first checked by ingest's own
// admission rule (ingest.Admit): one ingest would dead-letter is refused
// with its reason code, and nothing is published. When an executor answers
// on tollgate.tools.list, each call is also checked as the executor checks
// it (checkCalls): a call of a tool it does not have (TOOL_NOT_FOUND) or
// with arguments its schema refuses (ARGS_INVALID) is refused too.
func cmdSend(cmd *command, args []string) int {
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
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
	policyPath := fs.String("policy", scaffold.Env("TOLLGATE_POLICY", ""), "policy JSON the message is checked against, as ingest checks it; empty for the built-in policy (env TOLLGATE_POLICY)")
	fs.Var(&calls, "call", "proposed tool call, TOOL or TOOL={json object of arguments}; repeatable")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) > 0 || *session == "" || *sender == "" {
		return cmd.usageError("--session and --sender are required, and nothing else")
	}
	pol, err := policy.Load(*policyPath)
	if err != nil {
		return fail("send: %v", err)
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
	subject := topology.InboundSubject(*transport, *session)
	data, err := schemas.Encode(msg)
	if err == nil {
		_, err = ingest.Admit(subject, data, pol, schemas.Provenance{})
	}
	if err != nil {
		return fail("send: refused, nothing was published: %v", err)
	}
	if err := c.connect(); err != nil {
		return c.fail("send", err)
	}
	defer c.close()
	if err := checkCalls(&c, calls); err != nil {
		return fail("send: refused, nothing was published: %v", err)
	}
	ctx, cancel := c.ctx()
	defer cancel()
	// The message id is the dedupe key: a retried send is stored once.
	if _, err := bus.Store(ctx, c.js, subject, topology.InboundMsgID(*transport, *msgID), data, nil); err != nil {
		return c.fail("send", err)
	}
	turn := schemas.TurnID(*transport, *msgID)
	if c.json {
		printJSON(map[string]any{"turn_id": turn, "message_id": *msgID, "transport": *transport, "session_id": *session})
	} else {
		fmt.Println(turn)
	}
	return 0
}

// checkCalls checks calls against the tools a running executor lists, with
// the executor's own rule (tools.Catalog.Check): an unknown tool fails
// TOOL_NOT_FOUND, arguments that do not match the tool's schema fail
// ARGS_INVALID naming each mismatch. When no executor answers, or its list
// cannot be used, nothing is checked (a warning says so) and nil is
// returned: the executor will decide.
func checkCalls(c *client, calls []schemas.ProposedCall) error {
	if len(calls) == 0 {
		return nil
	}
	warn := func(why string) error {
		fmt.Fprintf(os.Stderr, "tollgate send: warning: calls not checked before sending (%s); `tollgate outcome` shows what the executor made of them\n", why)
		return nil
	}
	// Short: a user without the right to ask (least privilege gives it to
	// admin) gets no answer at all, only the wait.
	msg, err := c.nc.Request(topology.SubjectToolsList, nil, min(c.timeout, checkWait))
	if err != nil {
		return warn("no executor answered on " + topology.SubjectToolsList + " within " + checkWait.String())
	}
	var l schemas.ToolList
	if err := json.Unmarshal(msg.Data, &l); err != nil {
		return warn("the executor's tool list does not decode")
	}
	if len(l.Errors) > 0 {
		// A provider could not list its tools: a call of one of them
		// would be refused here although the executor may find it.
		return warn("the executor could not list every tool: " + strings.Join(l.Errors, "; "))
	}
	listed := make([]tools.Tool, len(l.Tools))
	for i, t := range l.Tools {
		listed[i] = listedTool{t.ToolSpec}
	}
	ctx, cancel := c.ctx()
	defer cancel()
	cat, err := tools.NewCatalog(ctx, listed, nil, nil)
	if err != nil {
		return warn(err.Error())
	}
	var errs []error
	for _, call := range calls {
		args := call.Args
		if args == "" {
			args = "{}"
		}
		if _, _, err := cat.Check(ctx, call.Tool, args); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkWait is how long send waits for an executor's tool list.
const checkWait = 2 * time.Second

// listedTool is a tool as the executor lists it: enough to check a call
// against, never run.
type listedTool struct{ spec tools.Spec }

func (t listedTool) Name() string     { return t.spec.Name }
func (t listedTool) Spec() tools.Spec { return t.spec }
func (t listedTool) RetrySafe() bool  { return t.spec.RetrySafe }
func (t listedTool) Run(context.Context, tools.Call) (string, error) {
	return "", errors.New("a listed tool is never run")
}
