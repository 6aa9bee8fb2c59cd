package toolsvc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/chaos/toolsvc"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// The service's two tools are found by natstool under the names the
// harness's policy and plan use, and a call through natstool is journaled
// once, as an Execution carrying the view of the caller's TurnContext.
func TestServiceIsFoundAndJournalsCalls(t *testing.T) {
	e := jstest.Start(t)
	ledger := filepath.Join(t.TempDir(), "ledger.jsonl")
	svc, err := toolsvc.Serve(e.NC, ledger, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found, err := natstool.New(e.NC, natstool.Options{}).Tools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var guarded tools.Tool
	for _, tool := range found {
		names = append(names, tool.Name())
		if tool.Name() == toolsvc.LedgerGuarded {
			guarded = tool
		}
	}
	if !slices.Equal(names, []string{toolsvc.Ledger, toolsvc.LedgerGuarded}) {
		t.Fatalf("tools found: %v", names)
	}
	if s := tools.SpecOf(guarded); s.Source != "nats:"+toolsvc.Service || s.RetrySafe || string(s.InputSchema) != toolsvc.Schema {
		t.Fatalf("spec: %+v", s)
	}

	tc := &schemas.TurnContext{
		V: 1, SessionID: "s-1", TurnID: "t-1", Transport: "chaos",
		Requester: schemas.Requester{Principal: "chaos:u1", SenderID: "u1", Kind: schemas.SenderUser, Verified: true},
		Channel:   schemas.Channel{ID: "dm-u1", Kind: schemas.ChannelDM}, Audience: schemas.AudiencePersonal, TrustBoundary: "local",
	}
	out, err := guarded.Run(ctx, tools.Call{Context: tc, CallID: "t-1-0", Args: `{"turn":1,"call":0}`})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	if want := "recorded t-1-0"; !strings.Contains(out, want) {
		t.Errorf("output %q, want it to contain %q", out, want)
	}
	b, err := os.ReadFile(ledger)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) != 1 {
		t.Fatalf("%d ledger lines, want 1:\n%s", len(lines), b)
	}
	var x toolsvc.Execution
	if err := json.Unmarshal(lines[0], &x); err != nil {
		t.Fatal(err)
	}
	if !x.Remote() || x.Crash || x.CallID != "t-1-0" || x.Tool != toolsvc.LedgerGuarded ||
		x.CtxTurnID != "t-1" || x.CtxSessionID != "s-1" || x.CtxPrincipal != "chaos:u1" || *x.View != natstool.View(tc) {
		t.Errorf("ledger line %s", lines[0])
	}
}
