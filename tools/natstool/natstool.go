// Package natstool makes NATS tool services Tollgate tools: services
// written in any language with a NATS service framework (nats.go's micro,
// @nats-io/services, or any client that speaks the NATS service protocol),
// found on the bus while Tollgate runs.
//
// # Discovery
//
// A Provider asks the bus which services run (a request on $SRV.INFO, the
// service protocol's discovery subject, see micro.ControlSubject) and
// collects the answers for at most Options.DiscoveryWait, from at most
// Options.MaxServices service instances. Every endpoint of an answer whose
// metadata has a key starting with "tollgate." is a tool:
//
//   - "tollgate.description": the tool's description;
//   - "tollgate.schema": the JSON Schema of its arguments (a JSON object);
//   - "tollgate.retry_safe": "true" when running a call again has the same
//     effect as running it once (tools.Retryable), "false" or absent if not;
//   - "tollgate.name": its name; absent, it is "<service>.<endpoint>";
//   - "tollgate.preview": the subject of the tool's preview endpoint, when
//     it offers one (see "The preview" below): a literal subject under
//     the same "tollgate.tool.<prefix>." as the tool's, not the tool's.
//
// The name is lower-cased and must pass schemas.CheckToolName. The
// endpoint's subject must be a literal subject "tollgate.tool.<prefix>.…"
// and the name must start with "<prefix>.": a tool service's NATS user may
// answer only under its own prefix (deploy/nats/least-privilege.conf), so
// a policy rule for "<prefix>.*" covers exactly the tools that user can
// serve. An endpoint that breaks a rule (a bad name or subject, an unknown
// "tollgate." key, a schema that is not a JSON object, a retry_safe other
// than "true" or "false") is not a tool.
//
// Discovery answers are not authenticated (any client that can answer
// $SRV.INFO can describe any endpoint), so a conflict is never resolved in
// anyone's favour: a tool name whose offers disagree (another subject,
// description, schema, retry_safe or service), a subject that backs two
// tool names, and a tool served by several instances not all in one queue
// group (each would run every call) are refused until the conflict is
// gone. A problem is logged when it first appears and counted in the
// tollgate_tool_service_discovery_problems gauge.
//
// The tools found are cached: Run refreshes them every
// Options.RefreshInterval, so a service that appears is offered, and one
// that is gone is no longer found, without a restart. Tools answers from
// the cache and never waits on the network, except for the very first
// discovery when Run has not done one yet (bounded by DiscoveryWait and
// its context). A refresh that fails keeps the tools last found.
//
// # Missed rounds
//
// A discovery round (Run's or Refresh's) that does not hear a service
// instance does not take its tools away at once: under load an answer can
// arrive after DiscoveryWait, and a tool that leaves for a round fails its
// calls TOOL_NOT_FOUND for that moment. An instance unheard for
// Options.MissedRounds rounds in a row (default 3) is gone. The service
// protocol has no message by which a service says it stops (micro's Stop
// only unsubscribes), so the server is asked instead: after each round
// that misses an instance, its own ping subject ($SRV.PING.<name>.<id>) is
// requested, and "no responders" (nobody subscribes to it: the service
// stopped or its connection is gone) takes its tools away at once; no
// answer in DiscoveryWait keeps them. While kept, an instance's tools are
// those it last described, and only for names and subjects that no
// instance heard in the round offers (a heard answer always wins, so a
// restarted instance replaces its predecessor at once); the conflict rules
// apply to them as to the others. A call of a kept tool whose service did
// stop fails unavailable (no responders: nothing ran) until it leaves.
//
// # The call
//
// A tool's Run sends one request (Request, JSON, with header
// Tollgate-Call-Id, and W3C traceparent/tracestate headers when the call
// is traced) to the endpoint's subject and takes the first reply;
// it never sends a call twice. See Tool.Run for how each outcome maps to
// an error (tools.ErrUncertain, tools.ErrUnavailable, a plain error when
// the service answered with a service error).
//
// # The preview
//
// A tool whose endpoint names a preview subject ("tollgate.preview") is a
// tools.Previewer (PreviewTool): before anyone is asked to approve a call,
// the executor sends one PreviewRequest (the call's id and arguments, no
// turn context: a preview acts for nobody) to that subject and waits for
// the first reply until the preview deadline. The reply body is JSON
// PreviewReply (kind and text, tools.Preview); a service error, a body
// that is not one, or no responder is a failed preview, no reply in time
// a timed-out one. Either way the prompt is made: a preview is advisory.
// The endpoint must not change anything: it runs for a call nobody has
// approved.
package natstool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/metrics"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// SubjectPrefix is where every tool endpoint's subject must live.
const SubjectPrefix = "tollgate.tool."

// Endpoint metadata keys that make an endpoint a tool.
const (
	MetaPrefix      = "tollgate."
	MetaName        = MetaPrefix + "name"
	MetaDescription = MetaPrefix + "description"
	MetaSchema      = MetaPrefix + "schema"
	MetaRetrySafe   = MetaPrefix + "retry_safe"
	MetaPreview     = MetaPrefix + "preview"
)

// Defaults of Options.
const (
	DefaultRefreshInterval = 10 * time.Second
	DefaultDiscoveryWait   = 500 * time.Millisecond
	DefaultMinRefreshGap   = time.Second
	DefaultMaxServices     = 256
	DefaultMaxTools        = 1024
	DefaultMaxReplyBytes   = 1 << 20
	DefaultCallTimeout     = time.Minute
	DefaultMissedRounds    = 3
)

// Options configures a Provider; zero values take the defaults above.
type Options struct {
	// Logger receives the tools found and gone and the discovery's
	// problems; nil discards.
	Logger *slog.Logger
	// Registerer receives the provider's metrics; nil registers none.
	Registerer prometheus.Registerer
	// RefreshInterval is how often Run discovers the services again.
	RefreshInterval time.Duration
	// DiscoveryWait is how long one discovery collects answers.
	DiscoveryWait time.Duration
	// MinRefreshGap is the least time between two discoveries that Refresh
	// (a name the catalog did not find) starts: a burst of calls of an
	// unknown tool costs at most one discovery per gap.
	MinRefreshGap time.Duration
	// MaxServices bounds the service instances one discovery reads; later
	// answers are dropped (logged).
	MaxServices int
	// MaxTools bounds the tools offered; the rest are ignored (logged).
	MaxTools int
	// MaxReplyBytes bounds a tool's reply body; a longer reply is
	// TOOL_REPLY_INVALID (the tool may have acted).
	MaxReplyBytes int
	// CallTimeout bounds a call whose context has no deadline (the
	// pipeline always gives one: its tool timeout).
	CallTimeout time.Duration
	// MissedRounds is how many discovery rounds in a row may miss a
	// service instance before its tools leave (see "Missed rounds"); 1
	// takes them away at the first round that misses it. An instance whose
	// ping has no responders leaves at once whatever this is.
	MissedRounds int
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = DefaultRefreshInterval
	}
	if o.DiscoveryWait <= 0 {
		o.DiscoveryWait = DefaultDiscoveryWait
	}
	if o.MinRefreshGap <= 0 {
		o.MinRefreshGap = DefaultMinRefreshGap
	}
	if o.MaxServices <= 0 {
		o.MaxServices = DefaultMaxServices
	}
	if o.MaxTools <= 0 {
		o.MaxTools = DefaultMaxTools
	}
	if o.MaxReplyBytes <= 0 {
		o.MaxReplyBytes = DefaultMaxReplyBytes
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.MissedRounds <= 0 {
		o.MissedRounds = DefaultMissedRounds
	}
}

// Provider is the tools.Provider (and tools.Service) of the NATS tool
// services on one connection. It is safe for concurrent use.
type Provider struct {
	nc  *nats.Conn
	o   Options
	log *slog.Logger

	// refreshing holds one token: whoever holds it discovers. It is a
	// channel, not a mutex, so that waiting for it respects a context.
	refreshing chan struct{}
	cache      atomic.Pointer[snapshot]
	// started is when the last completed discovery started (unix nanos).
	started atomic.Int64
	seen    map[string]bool // what the last discovery logged; guarded by refreshing
	// instances are the service instances heard in the last MissedRounds
	// rounds, by instanceKey; guarded by refreshing.
	instances map[string]*instance

	toolsGauge    prometheus.Gauge
	problemsGauge prometheus.Gauge
	calls         *prometheus.CounterVec
}

// instance is a service instance a discovery heard: what it said last, and
// how many rounds in a row have missed it since.
type instance struct {
	info   micro.Info
	missed int
}

func instanceKey(info micro.Info) string { return info.Name + "\x00" + info.ID }

// snapshot is what one discovery found.
type snapshot struct {
	tools  []tools.Tool // sorted by name; a *Tool, or a *PreviewTool with a preview
	byName map[string]*Tool
}

// New returns the provider of the tool services reachable on nc. It does
// not touch the network: discovery starts with Run or the first Tools. A
// metric that cannot be registered is logged and left unexported.
func New(nc *nats.Conn, o Options) *Provider {
	o.defaults()
	p := &Provider{
		nc: nc, o: o, log: o.Logger.With("provider", "nats"),
		refreshing: make(chan struct{}, 1),
		instances:  map[string]*instance{},
		toolsGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_tool_service_tools", Help: "Tools offered by NATS tool services at the last discovery.",
		}),
		problemsGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_tool_service_discovery_problems",
			Help: "Problems the last discovery of NATS tool services logged: endpoints or tools ignored, instances that disagree.",
		}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_tool_service_calls_total",
			Help: "Calls of NATS tool services, by outcome (ok, error, uncertain, unavailable, reply_invalid).",
		}, []string{"outcome"}),
	}
	for _, err := range []error{
		metrics.Register(o.Registerer, &p.toolsGauge),
		metrics.Register(o.Registerer, &p.problemsGauge),
		metrics.Register(o.Registerer, &p.calls),
	} {
		if err != nil {
			p.log.Error("natstool: metrics not exported", "err", err)
		}
	}
	return p
}

// Name implements tools.Provider.
func (p *Provider) Name() string { return "nats" }

// Tools implements tools.Provider: the tools of the last discovery, sorted
// by name. Before any discovery has completed it runs one, bounded by
// DiscoveryWait and ctx, and returns its error if it fails.
func (p *Provider) Tools(ctx context.Context) ([]tools.Tool, error) {
	if s := p.cache.Load(); s != nil {
		return slices.Clone(s.tools), nil
	}
	if err := p.refresh(ctx, true, time.Time{}); err != nil {
		return nil, err
	}
	return slices.Clone(p.cache.Load().tools), nil
}

// Refresh implements tools.Refresher: the catalog calls it when a call
// names a tool it does not know, so a service that started since the last
// discovery is found at once instead of after RefreshInterval. It
// discovers now unless a discovery started less than MinRefreshGap ago or
// one started while this call waited for its turn (concurrent misses share
// one), bounded by DiscoveryWait and ctx.
func (p *Provider) Refresh(ctx context.Context) error {
	asked := time.Now()
	if asked.Sub(time.Unix(0, p.started.Load())) < p.o.MinRefreshGap {
		return nil
	}
	return p.refresh(ctx, false, asked)
}

// Run implements tools.Service: it discovers the tool services at once and
// then every RefreshInterval until ctx is cancelled, and returns nil then.
// A failed discovery is logged; the tools last found stay.
func (p *Provider) Run(ctx context.Context) error {
	t := time.NewTicker(p.o.RefreshInterval)
	defer t.Stop()
	for {
		if err := p.refresh(ctx, false, time.Time{}); err != nil && ctx.Err() == nil {
			p.log.Warn("natstool: discovery failed; keeping the tools last found", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refresh runs one discovery and caches what it finds. With ifNone it
// does nothing if a discovery has completed while it waited for its turn;
// with a non-zero after (a miss's moment, Refresh), if the last completed
// discovery started after it or less than MinRefreshGap before it. The
// gap is checked again here, once the turn is this call's: a miss that
// came while another discovery ran passed Refresh's check against the one
// before, and would otherwise discover again at once.
func (p *Provider) refresh(ctx context.Context, ifNone bool, after time.Time) error {
	select {
	case p.refreshing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("natstool: discovery: %w", ctx.Err())
	}
	defer func() { <-p.refreshing }()
	if ifNone && p.cache.Load() != nil || !after.IsZero() && after.Sub(time.Unix(0, p.started.Load())) < p.o.MinRefreshGap {
		return nil
	}
	start := time.Now()
	infos, full, err := p.discover(ctx)
	if err != nil {
		return err
	}
	kept := p.remember(ctx, infos)
	p.cache.Store(p.resolve(infos, kept, full, p.cache.Load()))
	p.started.Store(start.UnixNano())
	return nil
}

// discover asks every service on the bus for its info and collects the
// answers for DiscoveryWait, or until MaxServices answered (full). It
// fails if ctx ends first.
func (p *Provider) discover(ctx context.Context) (infos []micro.Info, full bool, err error) {
	subject, err := micro.ControlSubject(micro.InfoVerb, "", "")
	if err != nil {
		return nil, false, err
	}
	wait, cancel := context.WithTimeout(ctx, p.o.DiscoveryWait)
	defer cancel()
	inbox := p.nc.NewInbox()
	sub, err := p.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false, fmt.Errorf("natstool: discovery: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := p.nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, false, fmt.Errorf("natstool: discovery: %w", err)
	}
	for len(infos) < p.o.MaxServices {
		m, err := sub.NextMsgWithContext(wait)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil, false, fmt.Errorf("natstool: discovery: %w", ctx.Err())
		case wait.Err() != nil && !errors.Is(err, nats.ErrConnectionClosed):
			return infos, false, nil // the wait is over
		case errors.Is(err, nats.ErrNoResponders):
			return nil, false, nil // no service runs
		default:
			return nil, false, fmt.Errorf("natstool: discovery: %w", err)
		}
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil || info.Type != micro.InfoResponseType {
			p.log.Debug("natstool: not a service info answer", "bytes", len(m.Data), "err", err)
			continue
		}
		infos = append(infos, info)
	}
	return infos, true, nil
}

// remember records the instances a round heard (infos) and returns the
// infos of those it missed that stay (see "Missed rounds"): missed fewer
// than MissedRounds rounds in a row, and not known to be gone by a ping
// without responders. The caller holds the refreshing token.
func (p *Provider) remember(ctx context.Context, infos []micro.Info) []micro.Info {
	heard := map[string]bool{}
	for _, info := range infos {
		k := instanceKey(info)
		heard[k] = true
		p.instances[k] = &instance{info: info}
	}
	var missed []*instance
	for k, in := range p.instances {
		if heard[k] {
			continue
		}
		in.missed++
		if in.missed >= p.o.MissedRounds {
			p.log.Info("natstool: service instance unheard; its tools leave", "service", in.info.Name, "instance", in.info.ID, "rounds", in.missed)
			delete(p.instances, k)
			continue
		}
		missed = append(missed, in)
	}
	if len(missed) == 0 {
		return nil
	}
	gone := p.pingGone(ctx, missed)
	var kept []micro.Info
	for i, in := range missed {
		if gone[i] {
			p.log.Info("natstool: service instance gone (its ping has no responders)", "service", in.info.Name, "instance", in.info.ID)
			delete(p.instances, instanceKey(in.info))
			continue
		}
		p.log.Debug("natstool: service instance unheard; its tools stay", "service", in.info.Name, "instance", in.info.ID, "rounds", in.missed)
		kept = append(kept, in.info)
	}
	return kept
}

// maxPings bounds the pings one round has in flight.
const maxPings = 16

// pingGone requests the ping subject of each instance, all within one
// DiscoveryWait, and reports which had no responders.
func (p *Provider) pingGone(ctx context.Context, ins []*instance) []bool {
	wait, cancel := context.WithTimeout(ctx, p.o.DiscoveryWait)
	defer cancel()
	gone := make([]bool, len(ins))
	sem := make(chan struct{}, maxPings)
	var wg sync.WaitGroup
	for i, in := range ins {
		subject, err := micro.ControlSubject(micro.PingVerb, in.info.Name, in.info.ID)
		if err != nil {
			continue // a name micro would not have served: the rounds decide
		}
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-wait.Done():
				return
			}
			defer func() { <-sem }()
			_, err := p.nc.RequestWithContext(wait, subject, nil)
			gone[i] = errors.Is(err, nats.ErrNoResponders)
		})
	}
	wg.Wait()
	return gone
}

// candidate is one endpoint of one service instance offered as a tool.
type candidate struct {
	spec       tools.Spec
	subject    string
	preview    string // the preview endpoint's subject, "" for none
	queueGroup string
	service    string
	instance   string
}

// resolve turns discovered service infos into tools, applying the rules of
// the package doc; kept are the infos of instances the round missed that
// stay (remember): their endpoints fill in only names and subjects that no
// heard endpoint claims. prev is the previous snapshot (nil at first), to
// log what appeared and what is gone; full says the discovery stopped at
// MaxServices. Each problem is logged when it first appears.
func (p *Provider) resolve(infos, kept []micro.Info, full bool, prev *snapshot) *snapshot {
	byKey := func(a, b micro.Info) int { return strings.Compare(instanceKey(a), instanceKey(b)) }
	slices.SortFunc(infos, byKey)
	slices.SortFunc(kept, byKey)
	notes := map[string]bool{}
	note := func(msg string, args ...any) {
		key := fmt.Sprint(append([]any{msg}, args...)...)
		if !notes[key] && !p.seen[key] {
			p.log.Warn("natstool: "+msg, args...)
		}
		notes[key] = true
	}
	if full {
		note("discovery read the most service instances it may; others are not offered", "max_services", p.o.MaxServices)
	}

	byName := map[string][]candidate{}
	namesOf := map[string][]string{} // subject -> tool names offered on it
	add := func(c candidate) {
		if !slices.Contains(namesOf[c.subject], c.spec.Name) {
			namesOf[c.subject] = append(namesOf[c.subject], c.spec.Name)
		}
		byName[c.spec.Name] = append(byName[c.spec.Name], c)
	}
	claimed := map[string]bool{} // names and subjects of every tool endpoint heard, valid or not
	for _, info := range infos {
		for _, ep := range info.Endpoints {
			c, ok, err := toCandidate(info, ep)
			if !ok {
				continue
			}
			claimed["name:"+c.spec.Name], claimed["subject:"+c.subject] = true, true
			if err != nil {
				note("endpoint ignored", "service", info.Name, "endpoint", ep.Name, "subject", ep.Subject, "reason", err.Error())
				continue
			}
			add(c)
		}
	}
	for _, info := range kept {
		for _, ep := range info.Endpoints {
			c, ok, err := toCandidate(info, ep)
			if ok && err == nil && !claimed["name:"+c.spec.Name] && !claimed["subject:"+c.subject] {
				add(c) // its problems were noted when it was heard
			}
		}
	}

	s := &snapshot{byName: map[string]*Tool{}}
	// New tools are logged one line per source (service), so that a
	// service of many endpoints (the gateway's claude.* gates) is one line.
	found := map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		cands := byName[name]
		if reason := conflict(cands, namesOf); reason != "" {
			note("tool ignored", "tool", name, "reason", reason)
			continue
		}
		if len(s.tools) == p.o.MaxTools {
			note("tool ignored: too many tools", "tool", name, "max_tools", p.o.MaxTools)
			continue
		}
		t := &Tool{p: p, spec: cands[0].spec, subject: cands[0].subject, preview: cands[0].preview}
		if t.preview != "" {
			s.tools = append(s.tools, &PreviewTool{t})
		} else {
			s.tools = append(s.tools, t)
		}
		s.byName[name] = t
		if prev.get(name) == nil {
			found[t.spec.Source] = append(found[t.spec.Source], name)
		}
	}
	for _, src := range slices.Sorted(maps.Keys(found)) {
		p.log.Info("natstool: tools found", "source", src, "count", len(found[src]), "tools", strings.Join(found[src], " "))
	}
	if prev != nil {
		for name, t := range prev.byName {
			if s.byName[name] == nil {
				p.log.Info("natstool: tool gone", "tool", name, "source", t.spec.Source)
			}
		}
	}
	p.seen = notes
	p.toolsGauge.Set(float64(len(s.tools)))
	p.problemsGauge.Set(float64(len(notes)))
	return s
}

func (s *snapshot) get(name string) *Tool {
	if s == nil {
		return nil
	}
	return s.byName[name]
}

// conflict explains why the instances offering one tool name cannot be
// trusted with it ("" if they can): they disagree on what it is, its
// subject also backs another tool name, or they would each receive every
// call (several instances, not all in one queue group).
func conflict(cs []candidate, namesOf map[string][]string) string {
	first := cs[0]
	for _, c := range cs[1:] {
		if c.subject != first.subject || c.spec.Source != first.spec.Source || c.spec.Description != first.spec.Description ||
			string(c.spec.InputSchema) != string(first.spec.InputSchema) || c.spec.RetrySafe != first.spec.RetrySafe ||
			c.preview != first.preview {
			return fmt.Sprintf("instances disagree on what it is (%s/%s on %s, %s/%s on %s)",
				first.service, first.instance, first.subject, c.service, c.instance, c.subject)
		}
	}
	if names := namesOf[first.subject]; len(names) > 1 {
		return fmt.Sprintf("its subject %s also backs %v", first.subject, names)
	}
	if len(cs) > 1 {
		for _, c := range cs {
			if c.queueGroup == "" || c.queueGroup != first.queueGroup {
				return fmt.Sprintf("served by %d instances outside one queue group: each would run every call", len(cs))
			}
		}
	}
	return ""
}

// toCandidate reads one endpoint: ok is false when it is not a tool (no
// tollgate metadata), err says why a would-be tool is refused.
func toCandidate(info micro.Info, ep micro.EndpointInfo) (c candidate, ok bool, err error) {
	tollgate := false
	for k := range ep.Metadata {
		if strings.HasPrefix(k, MetaPrefix) {
			tollgate = true
			if k != MetaName && k != MetaDescription && k != MetaSchema && k != MetaRetrySafe && k != MetaPreview {
				err = errors.Join(err, fmt.Errorf("unknown metadata key %q", k))
			}
		}
	}
	if !tollgate {
		return c, false, nil
	}
	name := ep.Metadata[MetaName]
	if name == "" {
		name = info.Name + "." + ep.Name
	}
	name = strings.ToLower(name)
	if nerr := schemas.CheckToolName(name); nerr != nil {
		err = errors.Join(err, nerr)
	}
	if prefix, serr := prefixOf(ep.Subject); serr != nil {
		err = errors.Join(err, serr)
	} else if !strings.HasPrefix(name, prefix+".") {
		err = errors.Join(err, fmt.Errorf("tool name %q does not start with %q, the token after %s of its subject", name, prefix+".", SubjectPrefix))
	}
	preview := ep.Metadata[MetaPreview]
	if preview != "" {
		callPrefix, _ := prefixOf(ep.Subject)
		if pp, perr := prefixOf(preview); perr != nil {
			err = errors.Join(err, fmt.Errorf("%s: %w", MetaPreview, perr))
		} else if pp != callPrefix || preview == ep.Subject {
			err = errors.Join(err, fmt.Errorf("%s %q is not another subject under %s%s", MetaPreview, preview, SubjectPrefix, callPrefix+"."))
		}
	}
	var retrySafe bool
	switch v := ep.Metadata[MetaRetrySafe]; v {
	case "", "false":
	case "true":
		retrySafe = true
	default:
		err = errors.Join(err, fmt.Errorf("%s is %q, want \"true\" or \"false\"", MetaRetrySafe, v))
	}
	var schema json.RawMessage
	if raw := strings.TrimSpace(ep.Metadata[MetaSchema]); raw != "" {
		var obj map[string]json.RawMessage
		if jerr := json.Unmarshal([]byte(raw), &obj); jerr != nil || obj == nil {
			err = errors.Join(err, fmt.Errorf("%s is not a JSON object", MetaSchema))
		}
		schema = json.RawMessage(raw)
	}
	return candidate{
		spec: tools.Spec{
			Name: name, Description: ep.Metadata[MetaDescription], Source: "nats:" + info.Name,
			InputSchema: schema, RetrySafe: retrySafe,
		},
		subject: ep.Subject, preview: preview, queueGroup: ep.QueueGroup, service: info.Name, instance: info.ID,
	}, true, err
}

// prefixOf returns the service token of a tool subject: a literal subject
// (no wildcards, no empty tokens, no white space)
// "tollgate.tool.<token>.<...>", with at least one token after <token>.
func prefixOf(subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, SubjectPrefix)
	if !ok {
		return "", fmt.Errorf("subject %q is not under %s", subject, SubjectPrefix)
	}
	for tok := range strings.SplitSeq(subject, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return "", fmt.Errorf("subject %q is not a literal subject", subject)
		}
	}
	prefix, _, ok := strings.Cut(rest, ".")
	if !ok {
		return "", fmt.Errorf("subject %q has no token after %s<service>", subject, SubjectPrefix)
	}
	return prefix, nil
}
