package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/store"
	"github.com/tollgate-dev/tollgate/pipeline/submit"
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
// it, and exits 0 with it or 1 with its rejection's reason code. The
// answer is the approval's decision when it answers the decision
// (DecidedEvent.Answers: it names it, as the decision or a counted vote,
// or it is the same principal's same option), taken from the approval
// record as the approvals bucket stores it (a revision heard on
// $KV.tollgate_approvals.<id> wakes the command, which then reads the
// record: a write that lost its compare-and-set is heard too, and is no
// decision); or the approval.decided event the approver publishes as its
// answer to a repeat of the recorded outcome (Repeat); or the decision's
// rejection (decision.rejected). A decision of someone else that won the
// race is not its answer: the approver then rejects this one
// APPROVAL_ALREADY_DECIDED. A counted vote that leaves the approval
// pending is answered once the quorum decides it (or not within
// --timeout). With --json the answer is printed as the decided event (or
// the rejection) the protocol defines (docs/protocol.md §4, §9.2).
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

	// Subscribe before publishing so the answer cannot be missed: the
	// approval record's revisions, the approval's rejections and its
	// turn's decided events (a repeat's answer).
	answers := make(chan *nats.Msg, 64)
	var subs []*nats.Subscription
	revisions := topology.ApprovalRevisionSubject(id)
	subjects := []string{revisions, topology.EventSubject(topology.SubjectDecisionRejected, id)}
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
	if _, err := submit.Decision(ctx, c.js, d); err != nil {
		return c.fail(option, err)
	}
	if *noWait {
		return report(c.json, map[string]any{"decision_id": d.DecisionID, "approval_id": id, "status": "submitted"}, "submitted "+d.DecisionID)
	}
	answered := func(ev *schemas.DecidedEvent, data []byte) int {
		human := fmt.Sprintf("%s %s (turn %s)", ev.Status, id, ev.TurnID)
		if schemas.IsGrantOption(option) && ev.Decision != nil && ev.Decision.DecisionID == d.DecisionID {
			human += "; grant " + schemas.GrantID(id, d.DecisionID) + " made ('tollgate grants show' it)"
		}
		return report(c.json, asMap(data), human)
	}
	stored := storedDecisions{js: c.js, id: id}
	for {
		select {
		case <-ctx.Done():
			why := ""
			if stored.err != nil {
				why = fmt.Sprintf("; its record could not be read: %v", stored.err)
			}
			return fail("%s: no answer from the approver within %v (decision %s is stored and will be applied when it runs)%s", option, c.timeout, d.DecisionID, why)
		case <-stored.again:
		case m := <-answers:
			if m.Subject == revisions {
				if ev, err := store.DecidedOf(m.Subject, m.Header, m.Data); err != nil || ev == nil {
					continue // a pending record (created, or a vote counted), a marker, a rewrite
				}
				break // a decision: read the record as stored
			}
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
			if ev, ok := rec.(*schemas.DecidedEvent); ok && ev.Answers(d) {
				// The approver's answer to a repeat (Repeat), or, from an
				// approver that still publishes every decision, the
				// decision itself.
				return answered(ev, m.Data)
			}
			continue
		}
		ev := stored.read(ctx)
		if ev == nil || !ev.Answers(d) {
			// Not stored yet (read again soon), or not this decision's
			// answer: another decision won the race, and the approver
			// rejects this one (APPROVAL_ALREADY_DECIDED), which comes
			// next.
			continue
		}
		data, err := schemas.Encode(ev)
		if err != nil {
			return fail("%s: %v", option, err)
		}
		return answered(ev, data)
	}
}

// storedDecisions reads the decision of approval id as its record is
// stored, for cmdDecide: a revision heard on the bucket's subject is a
// write sent, not yet a write stored (nor ever, if its compare-and-set
// lost), so the answer is taken from the stored record alone.
type storedDecisions struct {
	js    jetstream.JetStream
	id    string
	kv    jetstream.KeyValue // opened on the first read
	err   error              // the last read's failure
	wait  time.Duration      // before the next read, while the record is pending
	again <-chan time.Time   // fires when a read found the record pending
}

// Reads again after a read that found the record still pending (the write
// heard is not stored yet): first after storedRetryFirst, doubling up to
// storedRetryMax.
const (
	storedRetryFirst = 5 * time.Millisecond
	storedRetryMax   = 250 * time.Millisecond
)

// read returns the decided event of the stored record (schemas.DecidedOf),
// or nil while it is pending or cannot be read; then it sets again to
// fire for the next read.
func (s *storedDecisions) read(ctx context.Context) *schemas.DecidedEvent {
	s.again = nil
	ev, err := s.get(ctx)
	s.err = err
	if ev != nil {
		return ev
	}
	s.wait = min(max(2*s.wait, storedRetryFirst), storedRetryMax)
	s.again = time.After(s.wait)
	return nil
}

func (s *storedDecisions) get(ctx context.Context) (*schemas.DecidedEvent, error) {
	if s.kv == nil {
		kv, err := s.js.KeyValue(ctx, topology.BucketApprovals)
		if err != nil {
			return nil, fmt.Errorf("open the approvals bucket: %w", err)
		}
		s.kv = kv
	}
	e, err := s.kv.Get(ctx, s.id)
	if err != nil {
		return nil, fmt.Errorf("read approval %s: %w", s.id, err)
	}
	rec, err := schemas.Decode[schemas.ApprovalRecord](e.Value())
	if err != nil {
		return nil, fmt.Errorf("decode approval %s: %w", s.id, err)
	}
	return schemas.DecidedOf(rec), nil
}

func report(asJSON bool, v any, human string) int {
	if asJSON {
		printJSON(v)
	} else {
		fmt.Println(human)
	}
	return 0
}
