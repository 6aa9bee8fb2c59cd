package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/bus"
	"github.com/tollgate-dev/tollgate/schemas"
)

var (
	approveCmd = &command{
		name:    "approve",
		args:    "APPROVAL_ID --as SENDER",
		summary: "approve a pending approval, as the sender named by --as, and wait for the approver's answer",
		example: "tollgate approve a-0123456789abcdef0123-0 --as alice --digest sha256:...",
		run:     cmdDecide,
	}
	denyCmd = &command{
		name:    "deny",
		args:    "APPROVAL_ID --as SENDER",
		summary: "deny a pending approval, as the sender named by --as, and wait for the approver's answer",
		example: "tollgate deny a-0123456789abcdef0123-0 --as alice --note 'wrong file'",
		run:     cmdDecide,
	}
)

// cmdDecide publishes a decision and waits for the approver's answer to
// it: the decided event that names it (as the decision or a counted vote)
// or its rejection with the reason code (exit status 1). A decided event
// of another decision that won the race is not its answer: the approver
// then rejects this one APPROVAL_ALREADY_DECIDED.
func cmdDecide(cmd *command, args []string) int {
	option := cmd.name
	fs := cmd.flags()
	var c client
	c.register(fs, defaultTimeout)
	as := fs.String("as", "", "decider's sender id on the transport (required)")
	transport := fs.String("transport", "cli", "transport the decision arrives on")
	kind := fs.String("sender-kind", "user", "user, bot or service")
	verified := fs.Bool("verified", true, "the transport verified the decider's identity")
	digest := fs.String("digest", "", "argument digest the decider was shown (sha256:...); rejected if it differs")
	note := fs.String("note", "", "free-text note")
	noWait := fs.Bool("no-wait", false, "publish and exit without waiting for the approver")
	grant := fs.String("grant", "", "choose a grant option the prompt offers ("+option+"-<name>, see 'tollgate show'): decide and grant the same for later calls")
	pos, exit, ok := cmd.parse(fs, args)
	if !ok {
		return exit
	}
	if len(pos) != 1 || *as == "" {
		return cmd.usageError("want one approval id and --as")
	}
	if *grant != "" {
		if !strings.HasPrefix(*grant, option+"-") || !schemas.IsGrantOption(*grant) {
			return cmd.usageError("--grant %q: want a grant option named %s-<name>", *grant, option)
		}
		option = *grant
	}
	id := pos[0]
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	d := &schemas.Decision{
		DecisionID: "d-" + hex.EncodeToString(b), ApprovalID: id, Transport: *transport,
		Decider: schemas.Sender{ID: *as, Kind: schemas.SenderKind(*kind), Verified: *verified},
		Option:  option, ArgsDigest: *digest, Note: *note, SentAt: time.Now().UTC(),
	}
	if _, err := schemas.Encode(d); err != nil {
		return fail("%s: %v", option, err)
	}
	if !schemas.ValidKey(id) {
		return fail("%s: %q is not an approval id", option, id)
	}
	if err := c.connect(); err != nil {
		return c.fail(option, err)
	}
	defer c.close()
	ctx, cancel := c.ctx()
	defer cancel()

	// Subscribe before publishing so the answer cannot be missed.
	answers := make(chan *nats.Msg, 64)
	var subs []*nats.Subscription
	subjects := []string{topology.EventSubject(topology.SubjectDecisionRejected, id)}
	if turn := schemas.TurnIDOfApproval(id); turn != "" {
		subjects = append(subjects, topology.EventSubject(topology.SubjectApprovalDecided, turn))
	}
	for _, s := range subjects {
		sub, err := c.nc.ChanSubscribe(s, answers)
		if err != nil {
			return fail("%s: %v", option, err)
		}
		subs = append(subs, sub)
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	if err := c.nc.Flush(); err != nil {
		return fail("%s: %v", option, err)
	}
	if err := bus.Publish(ctx, c.js, topology.DecisionSubject(*transport, id), topology.DecisionMsgID(d.DecisionID), d); err != nil {
		return c.fail(option, err)
	}
	if *noWait {
		return report(c.json, map[string]any{"decision_id": d.DecisionID, "approval_id": id, "status": "submitted"}, "submitted "+d.DecisionID)
	}
	for {
		select {
		case <-ctx.Done():
			return fail("%s: no answer from the approver within %v (decision %s is stored and will be applied when it runs)", option, c.timeout, d.DecisionID)
		case m := <-answers:
			_, rec, _ := topology.Read(m.Subject, m.Data, topology.RouteDecisionRejected, topology.RouteApprovalDecided)
			if rej, ok := rec.(*schemas.DecisionRejected); ok {
				if rej.DecisionID != d.DecisionID {
					continue
				}
				if c.json {
					printJSON(asMap(m.Data))
				} else {
					fmt.Fprintf(os.Stderr, "rejected: %s: %s\n", rej.Code, rej.Reason)
				}
				return 1
			}
			ev, ok := rec.(*schemas.DecidedEvent)
			if !ok || !ev.Answers(d) {
				// Not this decision's answer: another decision won the
				// race, and the approver rejects this one
				// (APPROVAL_ALREADY_DECIDED), which comes next.
				continue
			}
			human := fmt.Sprintf("%s %s (turn %s)", ev.Status, id, ev.TurnID)
			if schemas.IsGrantOption(option) && ev.Decision != nil && ev.Decision.DecisionID == d.DecisionID {
				human += "; grant " + schemas.GrantID(id, d.DecisionID) + " made ('tollgate grants show' it)"
			}
			return report(c.json, asMap(m.Data), human)
		}
	}
}

func report(asJSON bool, v any, human string) int {
	if asJSON {
		printJSON(v)
	} else {
		fmt.Println(human)
	}
	return 0
}
