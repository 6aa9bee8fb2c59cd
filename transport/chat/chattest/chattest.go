// Package chattest is the conformance suite of Tollgate's chat transports
// (transport/chat): every platform runs TestTransport against its own fake
// server, as Watermill's pubsub implementations run
// pubsub/tests.TestPubSub. The suite drives a real pipeline
// (pipelinetest: an embedded nats-server and the four stages) and reads
// what the fake platform received, so it checks the lifecycle every
// platform shares through the platform's real client and renderer: a
// prompt posted once (replays post nothing), closed once in place with
// the status and the decider's note, outcomes and the planner's replies
// posted once where their audience allows and nowhere else, rejections
// shown to the decider, and the counters (one meaning per kind). A prompt
// is closed by its approval's decision in the approvals bucket, with or
// without a published approval.decided, and an approval decided before
// its request is not prompted.
package chattest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/pipeline/approver"
	"github.com/tollgate-dev/tollgate/pipeline/decisions"
	"github.com/tollgate-dev/tollgate/pipeline/outcomes"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/chat"
)

// Message is a message the fake platform received: a post, or an edit of
// a posted message.
type Message struct {
	// Edit: an edit of the message ID, not a post.
	Edit    bool
	Channel string
	// ID is the posted message's id (of an edit: the edited message's).
	ID string
	// Text is everything the message shows (its text, blocks or
	// components), as the platform received it.
	Text string
}

// Fake is the platform's fake server as the suite reads it.
type Fake interface {
	// Messages are the messages posted and edited, in order.
	Messages() []Message
}

// Transport is the platform's transport under test.
type Transport interface {
	Run(ctx context.Context) error
	Ready() error
	// Handler serves the platform's inbound requests (the suite serves
	// it on a loopback port for Features.Click).
	Handler() http.Handler
}

// Features says what the suite needs to know of the platform.
type Features struct {
	// Name is the transport name ("slack").
	Name string
	// User is the sender id of the person who asks and decides ("T1:U1");
	// DM is the id of their DM channel with the app, as the fake opens it.
	User, DM string
	// Other is the sender id of another person, who may not decide User's
	// turns.
	Other string
	// Click, when set, presses the button of option (schemas.OptionApprove)
	// on prompt as the sender user, through the platform's signed
	// endpoint served at url, and fails t when the click is not answered
	// 200. Without it the suite checks no clicks.
	Click func(t *testing.T, url string, prompt Message, user, option string)
}

// Constructor builds the platform's transport on js, with its metrics
// registered in reg, against a fake platform of its own.
type Constructor func(t *testing.T, js jetstream.JetStream, reg prometheus.Registerer) (Transport, Fake)

// Policy is the suite's policy: write_file needs an approval, which only
// the requester may give.
const Policy = `{"version": "chattest", "default_approval": "required", "tools": {"write_file": {"approval": "required"}}}`

// TestTransport runs the conformance suite against the transport
// newTransport builds.
func TestTransport(t *testing.T, f Features, newTransport Constructor) {
	h := pipelinetest.Start(t, pipelinetest.Options{Policy: Policy})
	reg := prometheus.NewRegistry()
	tr, fake := newTransport(t, h.JS, reg)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	srv := httptest.NewServer(tr.Handler())
	t.Cleanup(func() { srv.Close(); stop(); <-done })
	s := &suite{f: f, h: h, reg: reg, fake: fake, url: srv.URL}
	jstest.EventuallyState(t, jstest.Wait, "the transport is ready", func() (bool, string) { err := tr.Ready(); return err == nil, fmt.Sprint(err) })

	t.Run("PromptOnceClosedOnceWithTheNote", s.promptLifecycle)
	t.Run("ADecisionKeptOnlyInTheBucketClosesThePrompt", s.bucketDecision)
	t.Run("ADecisionBeforeItsRequestPromptsNothing", s.decisionFirst)
	t.Run("OutcomesAndRepliesOnceWhereTheirAudienceAllows", s.deliveries)
	t.Run("CountersHaveOneMeaningPerKind", s.counters)
}

type suite struct {
	f    Features
	h    *pipelinetest.H
	reg  *prometheus.Registry
	fake Fake
	url  string
	// want are the posts the suite has caused, by kind.
	want map[string]float64
	// rejections are the rejections the suite has caused.
	rejections float64
}

// note is the deny reason the suite sends: markup that must stay inert.
const note = "not today <!channel> @everyone **bold** [bank](http://evil.example) ```x```"

// promptLifecycle: a pending approval's prompt is posted once, however
// often its announcement is replayed; a decision by someone else is
// rejected and shown to them; the requester's deny closes it once, in
// place, with the status and the note; a replay after that posts nothing.
func (s *suite) promptLifecycle(t *testing.T) {
	h := s.h.For(t)
	m := &schemas.InboundMessage{
		Transport: s.f.Name, MessageID: "m-chattest-1", SessionID: s.f.Name + ":chattest-1",
		Sender:  schemas.Sender{ID: s.f.User, Kind: schemas.SenderUser, Verified: true},
		Channel: schemas.Channel{ID: s.f.DM, Kind: schemas.ChannelDM},
		Text:    "write a file", SentAt: time.Now().UTC(),
		Calls: []schemas.ProposedCall{{Tool: "write_file", Args: `{"path": "chattest.txt", "content": "x"}`}},
	}
	turn := h.Send(m)
	id := schemas.ApprovalID(turn, 0)
	rec := h.WaitPending(id)
	prompt := s.await(t, "the prompt", func() []Message { return s.posts(id) })
	Prompted(t, h.JS, s.f.Name, id)
	if prompt.Channel != s.f.DM {
		t.Errorf("the prompt of a DM turn went to %q, want the requester's DM %q", prompt.Channel, s.f.DM)
	}
	for _, want := range []string{"write_file", "chattest.txt", rec.ArgsDigest} {
		if !strings.Contains(prompt.Text, want) {
			t.Errorf("the prompt does not show %q: %s", want, prompt.Text)
		}
	}
	h.Publish(topology.SubjectApprovalRequested+turn, "", rec) // a replay

	if s.f.Click != nil {
		s.f.Click(t, s.url, prompt, s.f.Other, schemas.OptionApprove)
		s.rejections++
		jstest.EventuallyState(t, jstest.Wait, "the rejection is shown to the other user", func() (bool, string) {
			n := s.counter(t, "posts_total", "kind", chat.KindRejection)
			return n == s.rejections, fmt.Sprintf("posts_total{kind=rejection} = %v", n)
		})
		if a := h.Approval(id); a.Status != schemas.ApprovalPending {
			t.Fatalf("after another user's click the approval is %s, want pending", a.Status)
		}
	}

	d := h.Decision(id, schemas.OptionDeny, s.f.Name, s.f.User)
	d.Note = note
	h.Submit(d)
	closed := s.await(t, "the closed prompt", func() []Message { return s.edits(prompt.ID) })
	for _, want := range []string{"Denied", "not today", "bold"} {
		if !strings.Contains(closed.Text, want) {
			t.Errorf("the closed prompt does not show %q: %s", want, closed.Text)
		}
	}
	if closed.Channel != prompt.Channel {
		t.Errorf("the close edited a message in %q, the prompt is in %q", closed.Channel, prompt.Channel)
	}
	_, out := h.WaitTerminal(turn)
	s.await(t, "the outcome", func() []Message { return s.posts("Turn " + turn) })

	// Replays of every event of the turn, then a click on the closed
	// prompt: once all is consumed, nothing more was posted or edited.
	h.Publish(topology.SubjectApprovalRequested+turn, "", rec)
	h.Publish(topology.SubjectTurnOutcome+turn, "", out)
	if s.f.Click != nil {
		before := s.counter(t, "refused_total", "reason", chat.ReasonNotPending)
		s.f.Click(t, s.url, prompt, s.f.User, schemas.OptionApprove)
		jstest.EventuallyState(t, jstest.Wait, "the click on a decided approval is refused", func() (bool, string) {
			n := s.counter(t, "refused_total", "reason", chat.ReasonNotPending)
			return n == before+1, fmt.Sprintf("refused_total{reason=not_pending} = %v", n)
		})
	}
	s.consumed(t)
	if got := s.posts(id); len(got) != 1 {
		t.Errorf("the prompt was posted %d times: %v", len(got), got)
	}
	if got := s.edits(prompt.ID); len(got) != 1 {
		t.Errorf("the prompt was edited %d times: %v", len(got), got)
	}
	if got := s.posts("Turn " + turn); len(got) != 1 {
		t.Errorf("the outcome was posted %d times: %v", len(got), got)
	}
	s.add(chat.KindPrompt, chat.KindClose, chat.KindOutcome)
}

// decide records a decision on approval id in the approvals bucket as the
// approver does (a compare-and-set of the pending record: denied by the
// requester, with the suite's note), publishing nothing: the approver of
// issue 36's next step publishes no approval.decided for it.
func (s *suite) decide(h *pipelinetest.H, id string) {
	h.MutateApproval(id, func(a *schemas.ApprovalRecord) {
		a.Status = schemas.ApprovalDenied
		a.Decision = &schemas.DecisionInfo{DecisionID: "d-chattest-" + id, Principal: schemas.Principal(s.f.Name, s.f.User),
			Option: schemas.OptionDeny, DecidedAt: time.Now().UTC(), Note: note}
	})
}

// request announces rec, a pending approval of a turn whose log keeps no
// request (an earlier version's), on its approval.requested subject.
func request(h *pipelinetest.H, rec *schemas.ApprovalRecord) {
	h.Publish(topology.SubjectApprovalRequested+rec.TurnID, topology.RequestedMsgID(rec.ApprovalID), rec.SummaryOnly())
}

// bucketDecision: a decision kept only in the approvals bucket (no
// approval.decided is published) closes the prompt once, in place, with
// the status and the note; a published copy of it (as the approver
// publishes today) edits nothing more.
func (s *suite) bucketDecision(t *testing.T) {
	h := s.h.For(t)
	rec := h.SeedApproval(s.f.Name, s.f.Name+":chattest-3", s.f.User, "write_file", `{"path": "bucket.txt", "content": "x"}`, time.Now())
	request(h, rec)
	prompt := s.await(t, "the prompt", func() []Message { return s.posts(rec.ApprovalID) })
	Prompted(t, h.JS, s.f.Name, rec.ApprovalID)
	s.decide(h, rec.ApprovalID)
	closed := s.await(t, "the closed prompt", func() []Message { return s.edits(prompt.ID) })
	for _, want := range []string{"Denied", "not today"} {
		if !strings.Contains(closed.Text, want) {
			t.Errorf("the closed prompt does not show %q: %s", want, closed.Text)
		}
	}
	h.Publish(topology.SubjectApprovalDecided+rec.TurnID, "", schemas.DecidedOf(h.Approval(rec.ApprovalID)))
	s.consumed(t)
	if got := s.edits(prompt.ID); len(got) != 1 {
		t.Errorf("the prompt was edited %d times: %v", len(got), got)
	}
	s.add(chat.KindPrompt, chat.KindClose)
}

// decisionFirst: an approval decided before the transport reads its
// request (its decision handled first, with no prompt to close) is never
// prompted, so no prompt is left open.
func (s *suite) decisionFirst(t *testing.T) {
	h := s.h.For(t)
	rec := h.SeedApproval(s.f.Name, s.f.Name+":chattest-4", s.f.User, "write_file", `{"path": "first.txt", "content": "x"}`, time.Now())
	s.decide(h, rec.ApprovalID)
	s.consumed(t) // the decision is handled: there is no prompt to close
	request(h, rec)
	s.consumed(t)
	if got := s.posts(rec.ApprovalID); len(got) != 0 {
		t.Errorf("an approval decided before its request was prompted: %v", got)
	}
}

// deliveries: an outcome or reply goes to its reply target once, and only
// when it is this transport's, its channel no wider than its audience,
// and (for an outcome) not a planner step's.
func (s *suite) deliveries(t *testing.T) {
	h := s.h.For(t)
	dm := schemas.ReplyTarget{Transport: s.f.Name, Channel: schemas.Channel{ID: s.f.DM, Kind: schemas.ChannelDM}}
	public := schemas.ReplyTarget{Transport: s.f.Name, Channel: schemas.Channel{ID: "chattest-public", Kind: schemas.ChannelPublic}}
	private := schemas.ReplyTarget{Transport: s.f.Name, Channel: schemas.Channel{ID: "chattest-private", Kind: schemas.ChannelPrivate}}
	other := schemas.ReplyTarget{Transport: "cli", Channel: public.Channel}
	now := time.Now().UTC()
	outcome := func(turn string, a schemas.Audience, to schemas.ReplyTarget) *schemas.TurnOutcome {
		return &schemas.TurnOutcome{TurnID: turn, SessionID: "chattest-2", State: schemas.TurnCompleted, Audience: a, Reply: to, FinishedAt: now}
	}
	nowhere := s.counter(t, "refused_total", "reason", chat.ReasonNowhere)
	for _, o := range []*schemas.TurnOutcome{
		outcome("t-chattest-none", "", dm),                                                     // no audience: nowhere
		outcome("t-chattest-personal", schemas.AudiencePersonal, public),                       // wider than its audience: nowhere
		outcome("t-chattest-team", schemas.AudienceTeam, public),                               // wider than its audience: nowhere
		outcome("t-chattest-other", schemas.AudiencePublic, other),                             // another transport's: not ours
		outcome(schemas.PlannerStepTurnID("t-chattest-plan", 0), schemas.AudiencePersonal, dm), // a planner step: the planner's
		outcome("t-chattest-ok", schemas.AudienceTeam, private),
		outcome("t-chattest-ok", schemas.AudienceTeam, private), // a replay
	} {
		h.Publish(topology.SubjectTurnOutcome+o.TurnID, "", o)
	}
	// An outcome kept only in its turn log (the write that ended its
	// batch), and a published copy of it: posted once.
	logged := outcome("t-chattest-logged", schemas.AudienceTeam, private)
	logged.V = schemas.TurnOutcomeVersion
	h.EndInLog(logged)
	h.Publish(topology.SubjectTurnOutcome+logged.TurnID, "", logged)
	reply := &schemas.ReplyEvent{TurnID: "t-chattest-plan", SessionID: "chattest-2", Text: "chattest reply", Audience: schemas.AudiencePersonal, Reply: dm, At: now}
	h.Publish(topology.SubjectTurnReply+reply.TurnID, "", reply)
	h.Publish(topology.SubjectTurnReply+reply.TurnID, "", reply)
	s.consumed(t)
	for _, turn := range []string{"t-chattest-none", "t-chattest-personal", "t-chattest-team", "t-chattest-other", "t-chattest-plan"} {
		if got := s.posts("Turn " + turn); len(got) != 0 {
			t.Errorf("outcome of %s posted: %v", turn, got)
		}
	}
	if got := s.posts("Turn t-chattest-logged"); len(got) != 1 || got[0].Channel != private.Channel.ID {
		t.Errorf("the outcome t-chattest-logged, kept in its turn log: %v, want one post in %s", got, private.Channel.ID)
	}
	if got := s.posts("Turn t-chattest-ok"); len(got) != 1 || got[0].Channel != private.Channel.ID {
		t.Errorf("the outcome t-chattest-ok: %v, want one post in %s", got, private.Channel.ID)
	}
	if got := s.posts("chattest reply"); len(got) != 1 || got[0].Channel != s.f.DM {
		t.Errorf("the reply: %v, want one post in %s", got, s.f.DM)
	}
	if n := s.counter(t, "refused_total", "reason", chat.ReasonNowhere); n != nowhere+3 {
		t.Errorf("refused_total{reason=nowhere} went from %v to %v, want +3", nowhere, n)
	}
	s.add(chat.KindOutcome, chat.KindOutcome, chat.KindReply)
}

// counters: tollgate_<name>_posts_total counts each kind once per message
// of that meaning; a notice about an undecidable approval is not a
// rejection.
func (s *suite) counters(t *testing.T) {
	s.consumed(t)
	want := map[string]float64{chat.KindRejection: s.rejections}
	for k, n := range s.want {
		want[k] = n
	}
	for kind, n := range want {
		if got := s.counter(t, "posts_total", "kind", kind); got != n {
			t.Errorf("tollgate_%s_posts_total{kind=%q} = %v, want %v", s.f.Name, kind, got, n)
		}
	}
}

func (s *suite) add(kinds ...string) {
	if s.want == nil {
		s.want = map[string]float64{}
	}
	for _, k := range kinds {
		s.want[k]++
	}
}

// posts are the posted messages that show text.
func (s *suite) posts(text string) []Message { return s.having(false, text, "") }

// edits are the edits of message id.
func (s *suite) edits(id string) []Message { return s.having(true, "", id) }

func (s *suite) having(edit bool, text, id string) []Message {
	var out []Message
	for _, m := range s.fake.Messages() {
		if m.Edit == edit && strings.Contains(m.Text, text) && (id == "" || m.ID == id) {
			out = append(out, m)
		}
	}
	return out
}

// await waits for the first message list gives, and returns it.
func (s *suite) await(t *testing.T, what string, list func() []Message) Message {
	t.Helper()
	var got []Message
	jstest.EventuallyState(t, jstest.Wait, what, func() (bool, string) {
		got = list()
		return len(got) > 0, fmt.Sprintf("messages %v", s.fake.Messages())
	})
	return got[0]
}

// consumed waits until the transport's consumer has handled every event
// stored so far: the later fact after which an absence is asserted.
func (s *suite) consumed(t *testing.T) { Consumed(t, s.h.JS, s.f.Name) }

// counter reads tollgate_<name>_<metric>{label=value}.
func (s *suite) counter(t *testing.T, metric, label, value string) float64 {
	return Counter(t, s.reg, "tollgate_"+s.f.Name+"_"+metric, label, value)
}

// Consumed waits (20 seconds at most) until chat transport name's
// consumer on TOLLGATE_EVENTS has handled every event stored so far that
// it reads: the later fact after which a test asserts that nothing more
// was posted. Its ack floor must reach the last such event: the server
// acknowledges a publish before it tells the stream's consumers, so right
// after a publish the consumer's info can still say nothing is pending.
//
// Its consumers of the turn logs' outcome events (one per partition,
// outcomes.Durable) and of the approvals bucket's decided revisions
// (decisions.Durable) must have caught up too.
func Consumed(t testing.TB, js jetstream.JetStream, name string) {
	t.Helper()
	jstest.EventuallyState(t, jstest.Wait, "consumer "+chat.Durable(name)+" caught up", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return jstest.CaughtUp(ctx, js, topology.StreamEvents, chat.Durable(name))
	})
	decided := decisions.Durable(chat.Durable(name))
	jstest.EventuallyState(t, jstest.Wait, "consumer "+decided+" caught up", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return jstest.CaughtUp(ctx, js, topology.StreamApprovals, decided)
	})
	ctx, cancel := context.WithTimeout(context.Background(), jstest.Wait)
	defer cancel()
	logs, err := topology.OpenTurnLogs(ctx, js)
	if err != nil {
		t.Fatalf("chattest: %v", err)
	}
	for i := range logs {
		durable := outcomes.Durable(chat.Durable(name), i)
		jstest.EventuallyState(t, jstest.Wait, "consumer "+durable+" caught up", func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return jstest.CaughtUp(ctx, js, topology.TurnLogStream(i), durable)
		})
	}
}

// Counter reads counter metric{label=value} from reg; 0 when it has no
// such series.
func Counter(t testing.TB, reg prometheus.Gatherer, metric, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// StreamMsgs is how many messages stream holds.
func StreamMsgs(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return info.State.Msgs
}

// DecisionsSent is how many decisions reached the approver: those
// TOLLGATE_DECISIONS holds, and the requests its decision service
// (approver.DecideService) received, which no stream keeps (micro's
// $SRV.STATS of the one approver the test runs). A transport's click that
// is refused before it is sent adds to neither.
func DecisionsSent(t testing.TB, js jetstream.JetStream) uint64 {
	t.Helper()
	n := StreamMsgs(t, js, topology.StreamDecisions)
	m, err := js.Conn().Request("$SRV.STATS."+approver.DecideService, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("stats of the approver's decision service: %v", err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(m.Data, &stats); err != nil {
		t.Fatalf("stats of the approver's decision service: %v", err)
	}
	for _, e := range stats.Endpoints {
		n += uint64(e.NumRequests)
	}
	return n
}

// Prompted waits (20 seconds at most) until chat transport name has
// recorded the prompt of approval id: after the platform received the
// post, the record that binds the prompt's buttons is written a moment
// later, and a click before it is (rightly) action_mismatch.
func Prompted(t testing.TB, js jetstream.JetStream, name, id string) {
	t.Helper()
	jstest.EventuallyState(t, jstest.Wait, "the record of the prompt of "+id, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, chat.BucketRecords(name))
		if err == nil {
			_, err = kv.Get(ctx, chat.PromptKey(id))
		}
		return err == nil, fmt.Sprint(err)
	})
}
