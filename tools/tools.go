// Package tools defines the Tool interface, the Catalog that resolves a
// call's tool by name (static tools and tools of Providers: NATS tool
// services, MCP servers) and checks its arguments against the tool's JSON
// Schema, and the built-in tools.
//
// A tool runs under the TurnContext of the turn that proposed it; it must
// not derive authority from anywhere else. Tollgate guarantees a call is
// started at most once (see pipeline/batch): a tool need not be idempotent.
// If a worker dies while a tool runs, the call's result is reported as
// needs_attention (EXECUTION_UNCERTAIN) and the tool is not run again.
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Call is one invocation.
type Call struct {
	Context *schemas.TurnContext // the persisted authority; never nil when Run is called
	CallID  string
	Args    string // canonical JSON object
}

// Tool is something a turn can call.
type Tool interface {
	Name() string
	// Run performs the call and returns its output. An error means the tool
	// ran and failed; it is reported as the call's result, not retried.
	Run(ctx context.Context, c Call) (string, error)
}

// Retryable is implemented by a tool that is safe to run again for the same
// call: running it twice with the same Call (same CallID and arguments) has
// the same effect as running it once, because it has no side effect (echo)
// or makes its effect idempotent on Call.CallID (e.g. passes it as an
// idempotency key to the system it changes).
//
// It matters in one case only: a worker claimed a call, may have started
// the tool, and died before recording the result. After the claim lease, a
// call whose tool reports RetrySafe() true is run again under a fresh claim
// (compare-and-set, so one worker takes it over); any other tool is never
// re-run blindly: the call is reported needs_attention with
// EXECUTION_UNCERTAIN for a person to check. Tools that do not implement
// Retryable are treated as not safe to retry.
type Retryable interface {
	RetrySafe() bool
}

// SourceBuiltin is the Spec.Source of the built-in tools.
const SourceBuiltin = "builtin"

// yes and no are the values the built-ins' Hints point to.
var yes, no = true, false

// The built-ins' input schemas, made once (a Spec shares them: read only).
var (
	echoSchema = json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","description":"the text to return"}},` +
		`"additionalProperties":false}`)
	writeFileSchema = json.RawMessage(`{"type":"object","properties":{` +
		`"path":{"type":"string","minLength":1,"description":"file path relative to the sandbox"},` +
		`"content":{"type":"string","description":"the file's new content"}},` +
		`"required":["path"],"additionalProperties":false}`)
	followUpSchema = json.RawMessage(`{"type":"object","properties":{` +
		`"tool":{"type":"string","description":"the tool to call"},` +
		`"args":{"type":"object","description":"its arguments (default {})"},` +
		`"delay":{"type":"string","description":"a Go duration from 0s to 168h (default 0s)"}},` +
		`"required":["tool"],"additionalProperties":false}`)
)

// RetrySafe reports whether t declares itself safe to run again (Retryable).
func RetrySafe(t Tool) bool {
	r, ok := t.(Retryable)
	return ok && r.RetrySafe()
}

// Builtins returns the built-in tools. write_file writes inside sandboxDir,
// which is created if missing.
func Builtins(sandboxDir string) ([]Tool, error) {
	if err := os.MkdirAll(sandboxDir, 0o750); err != nil {
		return nil, fmt.Errorf("tools: sandbox %s: %w", sandboxDir, err)
	}
	abs, err := filepath.Abs(sandboxDir)
	if err != nil {
		return nil, fmt.Errorf("tools: sandbox %s: %w", sandboxDir, err)
	}
	return []Tool{Echo{}, &WriteFile{Dir: abs}}, nil
}

// Echo returns its "text" argument. It has no side effect.
type Echo struct{}

func (Echo) Name() string { return "echo" }

// Spec implements Describer.
func (Echo) Spec() Spec {
	return Spec{
		Description: "Returns its text argument. No side effect.",
		Source:      SourceBuiltin,
		InputSchema: echoSchema,
		Hints:       Hints{ReadOnly: &yes, Destructive: &no},
	}
}

// RetrySafe implements Retryable: echo has no side effect.
func (Echo) RetrySafe() bool { return true }

func (Echo) Run(_ context.Context, c Call) (string, error) {
	var a struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(c.Args), &a); err != nil {
		return "", fmt.Errorf("echo: args: %w", err)
	}
	return a.Text, nil
}

// WriteFile writes "content" to the relative "path" inside Dir. Paths that
// would leave Dir (absolute, "..", symlinks out) are refused by os.Root.
// The sandbox directory is opened once, on first use, and the handle kept
// (os.Root is safe for concurrent use); should the directory be replaced
// later, a write that finds nothing under the old handle opens it again.
// A missing parent directory of path is created.
type WriteFile struct {
	Dir string

	mu   sync.Mutex
	root *os.Root
}

func (*WriteFile) Name() string { return "write_file" }

// Spec implements Describer.
func (*WriteFile) Spec() Spec {
	return Spec{
		Description: "Writes content to a file at a relative path inside the sandbox directory, replacing the file if it exists.",
		Source:      SourceBuiltin,
		InputSchema: writeFileSchema,
		Hints:       Hints{ReadOnly: &no, Destructive: &yes},
	}
}

// writeFileArgs decodes write_file's arguments; path is required.
func writeFileArgs(args string) (a struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}, err error) {
	if err := json.Unmarshal([]byte(args), &a); err != nil {
		return a, fmt.Errorf("write_file: args: %w", err)
	}
	if a.Path == "" {
		return a, errors.New("write_file: path is required")
	}
	return a, nil
}

func (w *WriteFile) Run(_ context.Context, c Call) (string, error) {
	a, err := writeFileArgs(c.Args)
	if err != nil {
		return "", err
	}
	root, err := w.sandbox(nil)
	if err != nil {
		return "", fmt.Errorf("write_file: open sandbox: %w", err)
	}
	err = writeIn(root, a.Path, a.Content)
	if errors.Is(err, fs.ErrNotExist) {
		// The sandbox directory may have been replaced since it was
		// opened: once more, under a fresh handle.
		if root, rerr := w.sandbox(root); rerr == nil {
			err = writeIn(root, a.Path, a.Content)
		}
	}
	if err != nil {
		return "", fmt.Errorf("write_file: %w", err)
	}
	return fmt.Sprintf("wrote %d bytes to %s", len(a.Content), a.Path), nil
}

// sandbox returns the handle on Dir, opening it if there is none yet or
// if the current one is stale (the handle a write just failed under).
func (w *WriteFile) sandbox(stale *os.Root) (*os.Root, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.root != nil && w.root != stale {
		return w.root, nil
	}
	root, err := os.OpenRoot(w.Dir)
	if err != nil {
		return nil, err
	}
	if w.root != nil {
		_ = w.root.Close() // writes still using it fail and retry
	}
	w.root = root
	return root, nil
}

// writeIn writes content to path in root, creating path's directory if it
// is missing.
func writeIn(root *os.Root, path, content string) error {
	f, err := root.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if errors.Is(err, fs.ErrNotExist) {
		if dir := filepath.Dir(path); dir != "." {
			if err := root.MkdirAll(dir, 0o750); err != nil {
				return err
			}
			f, err = root.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
		}
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
