package natsconf_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// waitReported waits until the server has reported a permissions
// violation on c whose text contains want.
func (c *client) waitReported(t *testing.T, want string) {
	t.Helper()
	jstest.Eventually(t, wait, c.user+": "+want, func() bool {
		for _, e := range c.reported() {
			if strings.Contains(e, want) {
				return true
			}
		}
		return false
	})
}

// The toolsvc user runs a tool service ("deploys", as the Go example does)
// that the executor and the redriver discover and call under their own
// users; the tool service is refused everything else: calling or
// impersonating other tools, reading replies meant for others, events,
// streams and buckets, and a second reply to one request.
func TestToolServiceUserAnswersItsOwnCallsAndNothingElse(t *testing.T) {
	ns := startServer(t)
	admin := dial(t, ns, "admin")
	provision(t, admin)
	svc := dial(t, ns, "toolsvc")

	// The tool service, with the layout of examples/toolservice-go: its
	// endpoints under tollgate.tool.deploys, tools named deploys.*.
	reply := func(req micro.Request, out string) {
		_ = req.Respond([]byte(out), micro.WithHeaders(micro.Headers{natstool.HeaderCallID: {req.Headers().Get(natstool.HeaderCallID)}}))
	}
	s, err := micro.AddService(svc.nc, micro.Config{Name: "deploys", Version: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	g := s.AddGroup(natstool.SubjectPrefix + "deploys")
	meta := micro.WithEndpointMetadata(map[string]string{natstool.MetaDescription: "deploy"})
	if err := g.AddEndpoint("deploy", micro.HandlerFunc(func(req micro.Request) {
		reply(req, "deployed for "+req.Headers().Get(natstool.HeaderCallID))
	}), meta); err != nil {
		t.Fatal(err)
	}
	if err := g.AddEndpoint("twice", micro.HandlerFunc(func(req micro.Request) {
		reply(req, "first")
		reply(req, "second")
	}), meta); err != nil {
		t.Fatal(err)
	}
	if err := svc.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	tc := &schemas.TurnContext{
		TurnID: "cli:m-1", SessionID: "s-1", Transport: "cli",
		Requester: schemas.Requester{Principal: "cli:alice", SenderID: "alice", Kind: schemas.SenderUser, Verified: true},
		Channel:   schemas.Channel{ID: "dm-alice", Kind: schemas.ChannelDM}, Audience: schemas.AudiencePersonal,
	}
	call := func(t *testing.T, c *client, tool, callID string) (string, error) {
		t.Helper()
		ts, err := natstool.New(c.nc, natstool.Options{Logger: pipelinetest.Logger()}).Tools(ctx(t, wait))
		if err != nil {
			t.Fatalf("%s: discovery: %v", c.user, err)
		}
		for _, tl := range ts {
			if tl.Name() == tool {
				return tl.Run(ctx(t, wait), tools.Call{Context: tc, CallID: callID, Args: `{}`})
			}
		}
		t.Fatalf("%s: %s not discovered (reported: %v)", c.user, tool, c.reported())
		return "", nil
	}
	for _, user := range []string{"executor", "redriver"} {
		t.Run(user+" discovers and calls the tool service", func(t *testing.T) {
			c := dial(t, ns, user)
			callID := "cli:m-1-" + user
			if out, err := call(t, c, "deploys.deploy", callID); err != nil || out != "deployed for "+callID {
				t.Fatalf("%s: %q, %v", user, out, err)
			}
			if r := c.reported(); len(r) != 0 {
				t.Fatalf("%s was refused: %v", user, r)
			}
		})
	}
	// The planner lists the tools to offer them to the model; their calls
	// run in the executor and the redriver, never in the planner.
	t.Run("planner discovers the tool service and cannot call it", func(t *testing.T) {
		c := dial(t, ns, "planner")
		ts, err := natstool.New(c.nc, natstool.Options{Logger: pipelinetest.Logger()}).Tools(ctx(t, wait))
		if err != nil {
			t.Fatalf("planner: discovery: %v", err)
		}
		i := slices.IndexFunc(ts, func(tl tools.Tool) bool { return tl.Name() == "deploys.deploy" })
		if i < 0 || len(c.reported()) != 0 {
			t.Fatalf("planner: deploys.deploy discovered at %d; reported: %v", i, c.reported())
		}
		done := make(chan error, 1)
		go func() {
			_, err := ts[i].Run(ctx(t, wait), tools.Call{Context: tc, CallID: "cli:m-1-planner", Args: `{}`})
			done <- err
		}()
		c.waitDenied(t, natstool.SubjectPrefix+"deploys.deploy", done)
	})
	if r := svc.reported(); len(r) != 0 {
		t.Fatalf("the tool service was refused what it needs: %v", r)
	}

	t.Run("a second reply to one request is refused", func(t *testing.T) {
		if out, err := call(t, dial(t, ns, "executor"), "deploys.twice", "cli:m-1-twice"); err != nil || out != "first" {
			t.Fatalf("%q, %v", out, err)
		}
		// The caller is in another account: the request reached the tool
		// service through the service import, with a reply subject the
		// server made for it (_R_.<...>), to which one answer is allowed.
		svc.waitReported(t, `Permissions Violation for Publish to "_R_.`)
	})

	const forged = "t-forged"
	outcome := topology.EventSubject(topology.SubjectTurnOutcome, forged)
	published := func(stream, subject string) func(*testing.T) {
		return func(t *testing.T) {
			if n := stored(t, admin, stream, subject); n != 0 {
				t.Fatalf("%d messages on %s", n, subject)
			}
		}
	}
	adminKV, err := topology.OpenBuckets(ctx(t, wait), admin.js)
	if err != nil {
		t.Fatal(err)
	}
	noClaim := func(t *testing.T) {
		if _, err := adminKV.Claims.Get(ctx(t, wait), forged+"-0"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("claim %s-0: %v", forged, err)
		}
	}
	nothing := func(*testing.T) {}
	for _, rc := range []struct {
		name    string
		subject string
		check   func(*testing.T)
	}{
		{"toolsvc cannot call another tool", "tollgate.tool.payments.refund", nothing},
		{"toolsvc cannot discover other services", "$SRV.INFO", nothing},
		{"toolsvc cannot publish an event", outcome, published(topology.StreamEvents, outcome)},
		{"toolsvc cannot publish an inbound message", topology.InboundSubject("cli", "s1"), published(topology.StreamInbound, topology.InboundSubject("cli", "s1"))},
		{"toolsvc cannot write a claim", "$KV." + topology.BucketClaims + "." + forged + "-0", noClaim},
		{"toolsvc cannot use the JetStream API", "$JS.API.STREAM.INFO." + topology.StreamEvents, nothing},
	} {
		t.Run(rc.name, func(t *testing.T) {
			if err := svc.nc.Publish(rc.subject, []byte("forged")); err != nil {
				t.Fatal(err)
			}
			svc.waitDenied(t, rc.subject, nil)
			rc.check(t)
		})
	}
	for _, subject := range []string{
		"_INBOX.>",                      // replies to others' requests
		"tollgate.tool.>",               // every tool's calls
		"tollgate.tool.payments.refund", // another service's calls
		"$SRV.INFO.payments",            // answering discovery as another service
		"tollgate.event.>",
		"$KV.>",
	} {
		t.Run("toolsvc cannot subscribe to "+subject, func(t *testing.T) {
			if _, err := svc.nc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
			svc.waitReported(t, fmt.Sprintf("Permissions Violation for Subscription to %q", subject))
		})
	}
}
