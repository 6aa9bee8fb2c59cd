package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Ledger tool names. They behave identically; they exist separately because
// the policy decides per tool name whether a call runs at once, waits for an
// approval, waits for one that expires quickly, or is denied (the chaos
// harness's policy, internal/chaos, gives each name one of those modes).
const (
	LedgerTool         = "ledger"
	LedgerGuardedTool  = "ledger_guarded"
	LedgerExpiringTool = "ledger_expiring"
	LedgerDeniedTool   = "ledger_denied"
)

// LedgerNames are the names Ledgers registers.
var LedgerNames = []string{LedgerTool, LedgerGuardedTool, LedgerExpiringTool, LedgerDeniedTool}

// LedgerEntry is one line of a ledger file: one execution of a ledger tool,
// with what the tool saw of the TurnContext it ran under.
type LedgerEntry struct {
	CallID        string `json:"call_id"`
	Tool          string `json:"tool"`
	Args          string `json:"args"`
	CtxTurnID     string `json:"ctx_turn_id"`
	CtxSessionID  string `json:"ctx_session_id"`
	CtxPrincipal  string `json:"ctx_principal"`
	CtxStreamSeq  uint64 `json:"ctx_stream_seq"`
	ContextDigest string `json:"ctx_digest"` // schemas.ContextDigest of the context
	PID           int    `json:"pid"`
	At            int64  `json:"at"` // wall clock, Unix nanoseconds
}

// Ledger is a test tool with a visible side effect: each run appends one
// LedgerEntry as a JSON line to Path, in a single write on a file opened
// with O_APPEND, so lines of concurrent processes never interleave and a
// process killed at any point leaves either the whole line or none. It is
// registered only when a stage is started with TOLLGATE_LEDGER (see
// internal/stagecmd); it is not a built-in.
//
// The tool does not see the approval a call went through (tools.Call has no
// approval id): a reader joins on the call id, whose approval id is
// schemas.ApprovalID(turn, index).
type Ledger struct {
	ToolName string
	Path     string
}

// Ledgers returns one Ledger per name in LedgerNames writing to path, or nil
// when path is empty.
func Ledgers(path string) []Tool {
	if path == "" {
		return nil
	}
	ts := make([]Tool, 0, len(LedgerNames))
	for _, n := range LedgerNames {
		ts = append(ts, &Ledger{ToolName: n, Path: path})
	}
	return ts
}

func (l *Ledger) Name() string { return l.ToolName }

func (l *Ledger) Run(_ context.Context, c Call) (string, error) {
	tc := c.Context
	if tc == nil {
		return "", errors.New("ledger: no TurnContext")
	}
	e := LedgerEntry{
		CallID: c.CallID, Tool: l.ToolName, Args: c.Args,
		CtxTurnID: tc.TurnID, CtxSessionID: tc.SessionID, CtxPrincipal: tc.Requester.Principal,
		CtxStreamSeq: tc.Provenance.StreamSeq, ContextDigest: schemas.ContextDigest(tc),
		PID: os.Getpid(), At: time.Now().UnixNano(),
	}
	line, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("ledger: %w", err)
	}
	line = append(line, '\n')
	f, err := os.OpenFile(l.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return "", fmt.Errorf("ledger: %w", err)
	}
	n, err := f.Write(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != len(line) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(line))
	}
	if err != nil {
		return "", fmt.Errorf("ledger: %w", err)
	}
	return fmt.Sprintf("recorded %s in pid %d", c.CallID, e.PID), nil
}
