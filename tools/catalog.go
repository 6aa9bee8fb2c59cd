package tools

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Catalog resolves a call's tool by name: among the static tools (the
// built-ins and the Go tools the embedding program passes in), then among
// the tools the providers offer right now. It also checks a call's
// arguments against the tool's JSON Schema (Check).
//
// Names are unique. A static tool always keeps its name: a provider tool
// named like one is ignored. Two providers offering one name: the provider
// that offered it first keeps it while it offers it, and the newcomer is
// ignored (both logged once). NewCatalog refuses either collision when it
// is already there at start.
//
// A Catalog is safe for concurrent use. It caches nothing about the
// providers' tools (each resolution asks them, and a Provider answers from
// its own cache), so a tool that appears needs no restart and one that
// disappears is no longer found.
type Catalog struct {
	static    map[string]Tool
	providers []Provider
	log       *slog.Logger
	schemas   schemaCache

	mu     sync.Mutex
	owner  map[string]int  // provider tool name -> index of the provider that has it
	warned map[string]bool // collisions already logged
}

// NewCatalog returns the catalog of the static tools and the providers'
// tools. It lists every provider once with ctx (a provider that cannot
// list its tools yet is logged, not an error) and fails with an error
// naming the tools when a static tool is nil, unnamed or named twice, a
// static tool's schema does not compile, or a provider tool already
// collides with a static tool or another provider's tool. log may be nil.
func NewCatalog(ctx context.Context, static []Tool, providers []Provider, log *slog.Logger) (*Catalog, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Catalog{
		static: make(map[string]Tool, len(static)), providers: slices.Clone(providers), log: log,
		owner: map[string]int{}, warned: map[string]bool{},
	}
	var errs []error
	for i, t := range static {
		switch {
		case t == nil:
			errs = append(errs, fmt.Errorf("tools: tool %d is nil", i))
			continue
		case t.Name() == "":
			errs = append(errs, fmt.Errorf("tools: tool %d (%T) has no name", i, t))
			continue
		case c.static[t.Name()] != nil:
			errs = append(errs, fmt.Errorf("tools: %s registered twice", t.Name()))
			continue
		}
		c.static[t.Name()] = t
		if _, err := c.schemas.compile(SpecOf(t).InputSchema); err != nil {
			errs = append(errs, fmt.Errorf("tools: %s: input schema does not compile: %w", t.Name(), err))
		}
	}
	for i, p := range c.providers {
		if p == nil {
			errs = append(errs, fmt.Errorf("tools: provider %d is nil", i))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	_, collisions, failures := c.scan(ctx)
	for _, err := range failures {
		log.Warn("tool provider cannot list its tools yet", "err", err)
	}
	if len(collisions) > 0 {
		return nil, fmt.Errorf("tools: name collisions: %w", errors.Join(collisions...))
	}
	return c, nil
}

// Get returns the tool called name. It fails with TOOL_NOT_FOUND when no
// static tool and no provider has it, with TOOL_UNAVAILABLE when none has
// it and a provider could not list its tools (the tool may be one of
// them), and with ctx's error when ctx ends first. Each of these means the
// tool was not run.
func (c *Catalog) Get(ctx context.Context, name string) (Tool, error) {
	if t, ok := c.static[name]; ok {
		return t, nil
	}
	hits, failed := c.find(ctx, name)
	if len(hits) == 0 && ctx.Err() == nil && c.refresh(ctx) {
		// Not offered as far as the providers knew: let those that can
		// look again now (a service that just started), then once more.
		hits, failed = c.find(ctx, name)
	}
	if len(hits) > 0 {
		return c.pick(name, hits).tool, nil
	}
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("resolve tool %s: %w", name, ctx.Err())
	case len(failed) > 0:
		return nil, schemas.Errorf(schemas.CodeToolUnavailable, "no tool named %q is known, and %v", name, errors.Join(failed...))
	}
	return nil, schemas.Errorf(schemas.CodeToolNotFound, "no tool named %q", name)
}

// find asks every provider for the tool called name: the providers that
// offer it, and the errors of those that could not list their tools.
func (c *Catalog) find(ctx context.Context, name string) (hits []hit, failed []error) {
	for i, p := range c.providers {
		ts, err := p.Tools(ctx)
		if err != nil {
			failed = append(failed, fmt.Errorf("provider %s: %w", p.Name(), err))
			continue
		}
		if j := slices.IndexFunc(ts, func(t Tool) bool { return t != nil && t.Name() == name }); j >= 0 {
			hits = append(hits, hit{i, ts[j]})
		}
	}
	return hits, failed
}

// refresh asks every provider that is a Refresher to look again, and
// reports whether there was one. A failed look is logged: the name is then
// resolved from what the providers last knew.
func (c *Catalog) refresh(ctx context.Context) bool {
	any := false
	for _, p := range c.providers {
		if r, ok := p.(Refresher); ok {
			any = true
			if err := r.Refresh(ctx); err != nil {
				c.log.Debug("tool provider could not look again", "provider", p.Name(), "err", err)
			}
		}
	}
	return any
}

// Check returns the tool called name and its Spec if args (a JSON object)
// match the tool's input schema. It fails like Get, and with ARGS_INVALID,
// naming each place in args and in the schema that does not match, when
// they do not; with TOOL_UNAVAILABLE when the tool's schema does not
// compile (the arguments cannot be checked, so the call is refused).
func (c *Catalog) Check(ctx context.Context, name, args string) (Tool, Spec, error) {
	t, err := c.Get(ctx, name)
	if err != nil {
		return nil, Spec{}, err
	}
	s := SpecOf(t)
	if err := c.schemas.check(s, args); err != nil {
		return nil, s, err
	}
	return t, s, nil
}

// List returns the Spec of every tool, sorted by name, as Get would
// resolve each name now. Providers that cannot list their tools are named
// in the error, which comes with the specs of the others.
func (c *Catalog) List(ctx context.Context) ([]Spec, error) {
	all, collisions, failures := c.scan(ctx)
	for _, err := range collisions {
		c.warnOnce(err.Error())
	}
	specs := make([]Spec, 0, len(all))
	for _, t := range all {
		specs = append(specs, SpecOf(t))
	}
	slices.SortFunc(specs, func(a, b Spec) int { return cmp.Compare(a.Name, b.Name) })
	return specs, errors.Join(failures...)
}

const maxWarned = 1024

// hit is a provider's tool with a name being resolved.
type hit struct {
	provider int
	tool     Tool
}

// scan lists every tool as Get resolves it, with the collisions it finds
// (each ignored tool, and why) and the providers that could not list.
func (c *Catalog) scan(ctx context.Context) (all map[string]Tool, collisions, failures []error) {
	all = make(map[string]Tool, len(c.static))
	for n, t := range c.static {
		all[n] = t
	}
	byName := map[string][]hit{}
	var order []string
	for i, p := range c.providers {
		ts, err := p.Tools(ctx)
		if err != nil {
			failures = append(failures, fmt.Errorf("provider %s: %w", p.Name(), err))
			continue
		}
		for _, t := range ts {
			if t == nil {
				continue
			}
			name := t.Name()
			if err := schemas.CheckToolName(name); err != nil {
				collisions = append(collisions, fmt.Errorf("provider %s: tool ignored: %w", p.Name(), err))
				continue
			}
			if _, ok := c.static[name]; ok {
				collisions = append(collisions, fmt.Errorf("provider %s offers %s, which is a %s tool: ignored", p.Name(), name, SpecOf(c.static[name]).Source))
				continue
			}
			hs := byName[name]
			if len(hs) > 0 && hs[len(hs)-1].provider == i {
				collisions = append(collisions, fmt.Errorf("provider %s offers %s twice: the second is ignored", p.Name(), name))
				continue
			}
			if len(hs) == 0 {
				order = append(order, name)
			}
			byName[name] = append(hs, hit{i, t})
		}
	}
	if len(failures) == 0 {
		// Forget the holders of names no provider offers any more.
		c.mu.Lock()
		for name := range c.owner {
			if _, ok := byName[name]; !ok {
				delete(c.owner, name)
			}
		}
		c.mu.Unlock()
	}
	for _, name := range order {
		hs := byName[name]
		win := c.pick(name, hs)
		all[name] = win.tool
		for _, h := range hs {
			if h.provider != win.provider {
				collisions = append(collisions, c.collision(name, h.provider, win.provider))
			}
		}
	}
	return all, collisions, failures
}

// pick returns the one of hits (the providers' tools named name, in
// provider order) that keeps the name: the one of the provider that had
// it before if it still offers it, else the first. Every other one is
// logged once as ignored.
func (c *Catalog) pick(name string, hits []hit) hit {
	c.mu.Lock()
	win := hits[0]
	if o, ok := c.owner[name]; ok {
		if j := slices.IndexFunc(hits, func(h hit) bool { return h.provider == o }); j >= 0 {
			win = hits[j]
		}
	}
	c.owner[name] = win.provider
	c.mu.Unlock()
	for _, h := range hits {
		if h.provider != win.provider {
			c.warnOnce(c.collision(name, h.provider, win.provider).Error())
		}
	}
	return win
}

func (c *Catalog) collision(name string, loser, winner int) error {
	return fmt.Errorf("provider %s offers %s, which provider %s already offers: ignored", c.providers[loser].Name(), name, c.providers[winner].Name())
}

// warnOnce logs a collision the first time it is seen (the memory of what
// was logged is bounded: past maxWarned, it starts over).
func (c *Catalog) warnOnce(msg string) {
	c.mu.Lock()
	if len(c.warned) >= maxWarned {
		clear(c.warned)
	}
	seen := c.warned[msg]
	c.warned[msg] = true
	c.mu.Unlock()
	if !seen {
		c.log.Warn("tool name collision", "detail", msg)
	}
}
