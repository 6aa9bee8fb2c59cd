package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

// gatewayTransport is the transport of the bench's API key, as of
// `tollgate dev`'s dev key.
const gatewayTransport = "gateway"

// httpGateway is the HTTP gateway (transport/gateway) in this process, on
// a NATS connection of its own and a loopback port (127.0.0.1:0), with one
// API key (every scope, vouching for its senders, no rate limit), and the
// slots' keep-alive HTTP/1.1 connections to it.
//
// The slots speak HTTP/1.1 on their connections themselves (requests
// written whole, answers read with http.ReadResponse), as a load
// generator such as wrk does, rather than through net/http's Client: the
// client runs on the same two cores as the gateway, and the Client's
// per-request goroutine hand-offs and header maps cost about a quarter of
// what the HTTP path adds to a turn (profile of `make bench-profile`), CPU
// that an agent spends on its own machine. What the gateway receives and
// answers is the same.
type httpGateway struct {
	nc     *nats.Conn
	logf   *os.File
	addr   string
	token  string
	conns  chan *httpConn // idle connections, one per slot at most
	seq    atomic.Int64
	cancel context.CancelFunc
	done   chan error
}

// httpConn is one keep-alive connection to the gateway.
type httpConn struct {
	c   net.Conn
	r   *bufio.Reader
	buf []byte
}

// startGateway starts the gateway on e for conc concurrent clients; its
// log goes to gateway.log in e's directory at logLevel.
func startGateway(e *env, conc int, logLevel string) (*httpGateway, error) {
	nc, js, err := e.connect("bench-gateway")
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(e.dir, "gateway.log"))
	if err != nil {
		nc.Close()
		return nil, err
	}
	token, key := gateway.NewKey(gatewayTransport, []gateway.Scope{gateway.ScopeSubmit, gateway.ScopeRead, gateway.ScopeDecide}, true)
	// The submit and decision answers wait for the executor's and the
	// approver's facts as long as a turn may take, so that each carries
	// them.
	s, err := gateway.New(gateway.Config{
		JS: js, Policy: policy.Default(), Keys: []gateway.Key{key}, Logger: newLogger(logf, logLevel),
		Rate: rate.Inf, SubmitWait: turnTimeout, DecisionWait: turnTimeout,
	})
	var ln net.Listener
	if err == nil {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		nc.Close()
		logf.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &httpGateway{
		nc: nc, logf: logf, addr: ln.Addr().String(), token: token, cancel: cancel, done: make(chan error, 1),
		conns: make(chan *httpConn, conc),
	}
	go func() { g.done <- s.Serve(ctx, ln) }()
	return g, nil
}

// stop shuts the gateway down and closes its connection.
func (g *httpGateway) stop() {
	g.cancel()
	<-g.done
	for {
		select {
		case hc := <-g.conns:
			hc.c.Close()
			continue
		default:
		}
		break
	}
	g.nc.Close()
	g.logf.Close()
}

// turn runs one approval turn of session over the API, as an agent and
// its approver would: POST /v1/turns (the approval path's calls; the
// answer carries the gated call's pending approval and digest), POST the
// approval's decision with that digest (answered with the approver's
// verdict), then GET the turn with ?wait until it has ended
// (errTurnTimeout if it has not within turnTimeout). The message id is
// run-m-<n>, as the NATS driver's.
func (g *httpGateway) turn(ctx context.Context, run, session string) (turnTimes, error) {
	n := g.seq.Add(1)
	req := gateway.SubmitRequest{SessionID: session, Sender: gateway.SenderIn{ID: "alice", Display: "alice"}, Text: "please"}
	for _, c := range gatewayPath.calls(n) {
		req.Calls = append(req.Calls, gateway.CallIn{Tool: c.Tool, Args: json.RawMessage(c.Args)})
	}
	var hc *httpConn
	select {
	case hc = <-g.conns:
	default:
		c, err := net.DialTimeout("tcp", g.addr, 5*time.Second)
		if err != nil {
			return turnTimes{}, err
		}
		hc = &httpConn{c: c, r: bufio.NewReaderSize(c, 16<<10)}
	}
	tt, err := g.turnOn(ctx, hc, run, n, req)
	if err != nil {
		hc.c.Close() // its state is unknown: the next turn dials afresh
		return tt, err
	}
	select {
	case g.conns <- hc:
	default:
		hc.c.Close()
	}
	return tt, nil
}

// turnOn is turn's three requests on hc.
func (g *httpGateway) turnOn(ctx context.Context, hc *httpConn, run string, n int64, req gateway.SubmitRequest) (turnTimes, error) {
	var tt turnTimes
	var sub submitAnswer
	tt.sent = now()
	if err := g.do(ctx, hc, "POST", "/v1/turns", run+"-m-"+strconv.FormatInt(n, 10), req, http.StatusAccepted, &sub); err != nil {
		return tt, err
	}
	tt.pending = now()
	i := gatewayPath.approvalIndex()
	if len(sub.Calls) <= i || sub.Calls[i].Disposition != gateway.DispositionPending || sub.Calls[i].ApprovalID == "" {
		return tt, fmt.Errorf("turn %s submitted in state %s without its call %d pending: %+v", sub.TurnID, sub.State, i, sub.Calls)
	}
	c := sub.Calls[i]
	var dec struct {
		Status string `json:"status"`
	}
	tt.decided = now()
	if err := g.do(ctx, hc, "POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "",
		gateway.DecisionRequest{Option: schemas.OptionApprove, ArgsDigest: c.ArgsDigest, Decider: gateway.SenderIn{ID: "alice"}}, http.StatusOK, &dec); err != nil {
		return tt, err
	}
	if dec.Status != string(schemas.ApprovalApproved) {
		return tt, fmt.Errorf("approval %s: decision answered %s", c.ApprovalID, dec.Status)
	}
	var v struct {
		Terminal bool `json:"terminal"`
	}
	if err := g.do(ctx, hc, "GET", "/v1/turns/"+sub.TurnID+"?wait="+turnTimeout.String(), "", nil, http.StatusOK, &v); err != nil {
		return tt, err
	}
	if !v.Terminal {
		return tt, errTurnTimeout
	}
	tt.done = now()
	return tt, nil
}

// submitAnswer is what the slot reads of POST /v1/turns's answer
// (gateway.SubmitResponse). Like an agent, the slots decode only the
// fields they use: the load generator's own JSON decoding of whole turn
// views is client CPU on the same two cores, not the gateway's.
type submitAnswer struct {
	TurnID string `json:"turn_id"`
	State  string `json:"state"`
	Calls  []struct {
		Disposition string `json:"disposition"`
		ApprovalID  string `json:"approval_id"`
		ArgsDigest  string `json:"args_digest"`
	} `json:"calls"`
}

// do sends a request on hc with the key (body, if not nil, as JSON;
// idem, if set, as Idempotency-Key), reads the whole answer, checks its
// status and decodes its body into out. The connection's deadline is
// ctx's, or turnTimeout and a margin from now.
func (g *httpGateway) do(ctx context.Context, hc *httpConn, method, path, idem string, body any, want int, out any) error {
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return err
		}
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(turnTimeout + 10*time.Second)
	}
	if err := hc.c.SetDeadline(dl); err != nil {
		return err
	}
	b := hc.buf[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, g.addr...)
	b = append(b, "\r\nAuthorization: Bearer "...)
	b = append(b, g.token...)
	if idem != "" {
		b = append(b, "\r\nIdempotency-Key: "...)
		b = append(b, idem...)
	}
	if body != nil {
		b = append(b, "\r\nContent-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(data)), 10)
	}
	b = append(b, "\r\n\r\n"...)
	b = append(b, data...)
	hc.buf = b
	if _, err := hc.c.Write(b); err != nil {
		return err
	}
	resp, err := http.ReadResponse(hc.r, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, bytes.TrimSpace(rb))
	}
	return json.Unmarshal(rb, out)
}
