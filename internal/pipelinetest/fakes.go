// The test tools and fakes: Counter (a tool that counts its runs),
// Remote (a tool with a given spec that runs a function) and Provider (a
// tool provider whose list and failure a test sets).

package pipelinetest

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/tollgate-dev/tollgate/tools"
)

// Counter is a test tool that counts its runs per call id and records the
// TurnContext each ran under.
type Counter struct {
	ToolName string // default "count"

	mu    sync.Mutex
	runs  map[string]int
	calls []tools.Call
}

// Name implements tools.Tool.
func (c *Counter) Name() string {
	if c.ToolName == "" {
		return "count"
	}
	return c.ToolName
}

// Run implements tools.Tool.
func (c *Counter) Run(_ context.Context, call tools.Call) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string]int{}
	}
	c.runs[call.CallID]++
	c.calls = append(c.calls, call)
	return fmt.Sprintf("run %d of %s", c.runs[call.CallID], call.CallID), nil
}

// Runs returns how often callID ran.
func (c *Counter) Runs(callID string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[callID]
}

// Total returns how many runs there were in all.
func (c *Counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// Calls returns every call the tool received, in order.
func (c *Counter) Calls() []tools.Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// Remote is a test tool that describes itself like a provider's tool (its
// Spec is Desc, with Name and RetrySafe taken from the tool), counts its
// runs like Counter, and then returns Fail's error for the call, if Fail is
// set and returns one.
type Remote struct {
	Counter
	Desc tools.Spec
	Safe bool
	Fail func(tools.Call) error
}

// Spec implements tools.Describer.
func (r *Remote) Spec() tools.Spec { return r.Desc }

// RetrySafe implements tools.Retryable.
func (r *Remote) RetrySafe() bool { return r.Safe }

// Run implements tools.Tool.
func (r *Remote) Run(ctx context.Context, call tools.Call) (string, error) {
	out, _ := r.Counter.Run(ctx, call)
	if r.Fail != nil {
		if err := r.Fail(call); err != nil {
			return "", err
		}
	}
	return out, nil
}

// Provider is a tools.Provider whose tools a test sets, and changes while
// the pipeline runs (a tool service that appears, a tool that disappears
// after its call was approved), or makes fail to list them.
type Provider struct {
	ProviderName string // default "test"

	mu    sync.Mutex
	tools []tools.Tool
	err   error
}

// Name implements tools.Provider.
func (p *Provider) Name() string {
	if p.ProviderName == "" {
		return "test"
	}
	return p.ProviderName
}

// Tools implements tools.Provider.
func (p *Provider) Tools(context.Context) ([]tools.Tool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.tools), p.err
}

// Set replaces the provider's tools.
func (p *Provider) Set(ts ...tools.Tool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tools = ts
}

// Fail makes Tools fail with err (nil: list them again).
func (p *Provider) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}
