package bench

import (
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
// one HTTP client (keep-alive, an idle connection per slot) the closed
// loop's slots share.
type httpGateway struct {
	nc     *nats.Conn
	logf   *os.File
	url    string
	token  string
	client *http.Client
	seq    atomic.Int64
	cancel context.CancelFunc
	done   chan error
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
		nc: nc, logf: logf, url: "http://" + ln.Addr().String(), token: token, cancel: cancel, done: make(chan error, 1),
		client: &http.Client{
			Timeout:   turnTimeout + 10*time.Second,
			Transport: &http.Transport{MaxIdleConns: conc, MaxIdleConnsPerHost: conc, IdleConnTimeout: time.Minute},
		},
	}
	go func() { g.done <- s.Serve(ctx, ln) }()
	return g, nil
}

// stop shuts the gateway down and closes its connection.
func (g *httpGateway) stop() {
	g.cancel()
	<-g.done
	g.client.CloseIdleConnections()
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
	var tt turnTimes
	var sub submitAnswer
	tt.sent = time.Now()
	if err := g.do(ctx, "POST", "/v1/turns", run+"-m-"+strconv.FormatInt(n, 10), req, http.StatusAccepted, &sub); err != nil {
		return tt, err
	}
	tt.pending = time.Now()
	i := gatewayPath.approvalIndex()
	if len(sub.Calls) <= i || sub.Calls[i].Disposition != gateway.DispositionPending || sub.Calls[i].ApprovalID == "" {
		return tt, fmt.Errorf("turn %s submitted in state %s without its call %d pending: %+v", sub.TurnID, sub.State, i, sub.Calls)
	}
	c := sub.Calls[i]
	var dec struct {
		Status string `json:"status"`
	}
	tt.decided = time.Now()
	if err := g.do(ctx, "POST", "/v1/approvals/"+c.ApprovalID+"/decisions", "",
		gateway.DecisionRequest{Option: schemas.OptionApprove, ArgsDigest: c.ArgsDigest, Decider: gateway.SenderIn{ID: "alice"}}, http.StatusOK, &dec); err != nil {
		return tt, err
	}
	if dec.Status != string(schemas.ApprovalApproved) {
		return tt, fmt.Errorf("approval %s: decision answered %s", c.ApprovalID, dec.Status)
	}
	var v struct {
		Terminal bool `json:"terminal"`
	}
	if err := g.do(ctx, "GET", "/v1/turns/"+sub.TurnID+"?wait="+turnTimeout.String(), "", nil, http.StatusOK, &v); err != nil {
		return tt, err
	}
	if !v.Terminal {
		return tt, errTurnTimeout
	}
	tt.done = time.Now()
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

// do sends a request with the key (body, if not nil, as JSON; idem, if
// set, as Idempotency-Key), checks the answer's status and decodes its
// body into out.
func (g *httpGateway) do(ctx context.Context, method, path, idem string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, g.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+g.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: status %d, want %d: %s", method, path, resp.StatusCode, want, bytes.TrimSpace(data))
	}
	return json.Unmarshal(data, out)
}
