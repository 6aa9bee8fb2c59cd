package tools_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

func TestLedgersOnlyWithAPath(t *testing.T) {
	if ts := tools.Ledgers(""); ts != nil {
		t.Fatalf("Ledgers(\"\") = %v, want none", ts)
	}
	ts := tools.Ledgers(filepath.Join(t.TempDir(), "ledger.jsonl"))
	if _, err := tools.NewCatalog(context.Background(), ts, nil, nil); err != nil {
		t.Fatal(err)
	}
	if len(ts) != len(tools.LedgerNames) {
		t.Fatalf("%d ledger tools, want %d", len(ts), len(tools.LedgerNames))
	}
}

// Concurrent runs each append exactly one whole line that records the call
// and the context it ran under.
func TestLedgerAppendsOneLinePerRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := &tools.Ledger{ToolName: tools.LedgerGuardedTool, Path: path}
	ctx := &schemas.TurnContext{V: 1, TurnID: "t-1", SessionID: "s", Requester: schemas.Requester{Principal: "chaos:u"},
		Provenance: schemas.Provenance{StreamSeq: 7}}
	const n = 64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := l.Run(context.Background(), tools.Call{Context: ctx, CallID: fmt.Sprintf("t-1-%d", i), Args: `{"n":1}`}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e tools.LedgerEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if e.Tool != tools.LedgerGuardedTool || e.CtxTurnID != "t-1" || e.CtxSessionID != "s" || e.CtxPrincipal != "chaos:u" ||
			e.CtxStreamSeq != 7 || e.ContextDigest != schemas.ContextDigest(ctx) || e.PID != os.Getpid() || e.At == 0 {
			t.Errorf("entry %+v does not record the call's context", e)
		}
		seen[e.CallID] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct calls recorded, want %d", len(seen), n)
	}
}

func TestLedgerRefusesNoContext(t *testing.T) {
	l := &tools.Ledger{ToolName: tools.LedgerTool, Path: filepath.Join(t.TempDir(), "l")}
	if _, err := l.Run(context.Background(), tools.Call{CallID: "t-1-0"}); err == nil {
		t.Fatal("ran without a TurnContext")
	}
}
