// Package policy decides, from a JSON policy file, how a turn's context is
// built (per transport) and how each tool call is treated: run at once,
// require approval, or deny; who may decide; what options a prompt offers;
// and when an approval expires.
//
// A policy is immutable once loaded. Its Version is recorded on every
// approval so a decision can be traced to the rules it was made under.
//
// Defaults (documented in docs/protocol.md): a tool not named in the policy
// requires approval; the options offered are approve and deny; approvals
// expire after 7 days; an unknown transport gets trust boundary "external"
// and is interactive. The requester of a turn may always decide its
// approvals; the policy can name more approver principals, globally or per
// tool.
//
// # Which rule applies to a tool
//
// A key of "tools" is a tool name ("write_file", "github.create_issue") or
// a pattern "<prefix>.*" that names every tool whose name starts with
// "<prefix>." ("github.*": the tools of the MCP server or NATS tool service
// named github). A tool gets the rule that names it exactly, else the rule
// of the longest pattern that matches it, else none: default_approval and
// the file's settings. Everything a rule sets (mode, audiences, approvers,
// options, expiry, deciders) comes from that one rule.
//
// A tool's own claims about its effects (tools.Hints) only ever make the
// mode stricter, and only where no rule names the tool exactly: a tool
// that declares itself destructive gets "required" where a pattern or
// default_approval would let it run with "never". A rule that names the
// tool is applied as written, and a claim of being read-only loosens
// nothing.
package policy

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// Mode is how a tool call is treated.
//
// It is schemas.ToolMode, the type the tool list carries on the wire.
type Mode = schemas.ToolMode

const (
	ModeNever    Mode = "never"    // runs without approval
	ModeRequired Mode = "required" // waits for an approval
	ModeDeny     Mode = "deny"     // never runs
)

func validMode(m Mode) bool { return m == ModeNever || m == ModeRequired || m == ModeDeny }

// Duration is a time.Duration written as a Go duration string ("24h") or
// "none" (no expiry) in JSON.
type Duration struct {
	D    time.Duration
	None bool
}

// UnmarshalJSON parses "24h", "90m" or "none".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"24h\" or \"none\": %w", err)
	}
	if s == "none" {
		*d = Duration{None: true}
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v <= 0 {
		return fmt.Errorf("duration %q: want a positive Go duration or \"none\"", s)
	}
	*d = Duration{D: v}
	return nil
}

// ToolRule is the policy of one tool.
type ToolRule struct {
	Approval     Mode                      `json:"approval"`
	Audiences    map[schemas.Audience]Mode `json:"audiences,omitempty"`
	Approvers    []string                  `json:"approvers,omitempty"`
	Options      []string                  `json:"options,omitempty"`
	ExpiresAfter *Duration                 `json:"expires_after,omitempty"`
	// Deciders replaces the file's decider rules for this tool;
	// AudienceDeciders replaces them for turns of one audience.
	Deciders         *DeciderRule                      `json:"deciders,omitempty"`
	AudienceDeciders map[schemas.Audience]*DeciderRule `json:"audience_deciders,omitempty"`
	// Grants are the grant options the tool's prompts offer beside its
	// options (grants.go; docs/protocol.md, "Grants"). None by default.
	Grants []GrantRule `json:"grants,omitempty"`
}

// DeciderRule says who may decide an approval and how many must agree.
//
// A decider qualifies if the transport vouched for them at MinAssurance or
// above and they are the turn's requester (when Requester allows it), one of
// Principals, or a member of one of Groups. An approval is approved once
// Quorum distinct qualifying deciders approved it; one qualifying deny
// denies it.
type DeciderRule struct {
	// Requester: whether the turn's requester may decide. Default true.
	Requester *bool `json:"requester,omitempty"`
	// Principals ("transport:sender_id") and Groups (names from the file's
	// "groups") who may decide.
	Principals []string `json:"principals,omitempty"`
	Groups     []string `json:"groups,omitempty"`
	// MinAssurance: "verified" (the default and the floor: an unverified
	// sender never decides) or "strong" (a second factor).
	MinAssurance string `json:"min_assurance,omitempty"`
	// Quorum: distinct approvals needed. Default 1.
	Quorum int `json:"quorum,omitempty"`
}

// TransportRule says how ingest builds a TurnContext for a transport.
type TransportRule struct {
	TrustBoundary string `json:"trust_boundary"`
	// Interactive: whether a user on this transport can answer an approval
	// prompt. Bots and services never can.
	Interactive bool `json:"interactive"`
}

// File is the JSON shape of a policy file.
type File struct {
	Version          string                   `json:"version"`
	DefaultApproval  Mode                     `json:"default_approval"`
	Approvers        []string                 `json:"approvers,omitempty"`
	ExpiresAfter     *Duration                `json:"expires_after,omitempty"`
	Tools            map[string]ToolRule      `json:"tools"`
	Transports       map[string]TransportRule `json:"transports"`
	DefaultTransport *TransportRule           `json:"default_transport,omitempty"`
	// Groups of principals, named by decider rules.
	Groups map[string][]string `json:"groups,omitempty"`
	// Deciders is the default decider rule; TrustBoundaryDeciders replaces
	// it for turns of a trust boundary. Without either, the requester alone
	// (plus any "approvers") decides.
	Deciders              *DeciderRule            `json:"deciders,omitempty"`
	TrustBoundaryDeciders map[string]*DeciderRule `json:"trust_boundary_deciders,omitempty"`
	// Sessions: what a new turn does while its session waits on approvals.
	Sessions *SessionRule `json:"sessions,omitempty"`
}

// Busy modes of a SessionRule.
const (
	// BusyQueue: the new turn waits until the waiting batch ends.
	BusyQueue = "queue"
	// BusySupersede: the waiting batch's pending approvals are abandoned
	// (their calls get results saying so) and the new turn runs next.
	BusySupersede = "supersede"
)

// SessionRule is the session policy, globally and per transport.
type SessionRule struct {
	Busy       string            `json:"busy,omitempty"`       // queue (default) or supersede
	Transports map[string]string `json:"transports,omitempty"` // transport name -> busy mode
}

// Policy is a validated, immutable policy.
type Policy struct {
	f       File
	version string
	// patterns are the "<prefix>.*" rules, longest prefix first.
	patterns []pattern
}

// pattern is a rule for every tool whose name starts with prefix (which
// ends in ".").
type pattern struct {
	prefix string
	rule   ToolRule
}

// DefaultExpiry applies when neither the tool nor the file sets one.
const DefaultExpiry = 7 * 24 * time.Hour

// DefaultJSON is the built-in policy used when no file is given: echo runs
// freely, write_file needs approval (and is denied outright for public
// audiences), anything else needs approval.
const DefaultJSON = `{
  "version": "builtin-1",
  "default_approval": "required",
  "tools": {
    "echo":       {"approval": "never"},
    "write_file": {"approval": "required", "audiences": {"public": "deny"}, "expires_after": "24h"}
  },
  "transports": {
    "cli":     {"trust_boundary": "local", "interactive": true},
    "webhook": {"trust_boundary": "external", "interactive": false}
  },
  "default_transport": {"trust_boundary": "external", "interactive": true}
}`

// Default returns the built-in policy.
func Default() *Policy {
	p, err := Parse([]byte(DefaultJSON))
	if err != nil {
		panic("policy: built-in policy invalid: " + err.Error())
	}
	return p
}

// Load reads and parses a policy file; path "" means Default().
func Load(path string) (*Policy, error) {
	if path == "" {
		return Default(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	p, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	return p, nil
}

// Parse parses and validates a policy in three steps: decode the JSON
// strictly (decodeFile), check each section (File.check), compile the
// immutable Policy (compile). Unknown JSON fields are rejected so a typo
// cannot silently weaken a rule. Every error starts with "parse policy: ".
func Parse(b []byte) (*Policy, error) {
	f, err := decodeFile(b)
	if err == nil {
		err = f.check()
	}
	if err != nil {
		return nil, fmt.Errorf("parse policy: %w", err)
	}
	return compile(f, b), nil
}

// decodeFile decodes exactly one JSON object into a File, rejecting unknown
// fields and anything after the object.
func decodeFile(b []byte) (File, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return File{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return File{}, errors.New("trailing data after the policy object")
	}
	return f, nil
}

// check validates every section of f, in file order, and returns the first
// problem found.
func (f *File) check() error {
	if f.DefaultApproval != "" && !validMode(f.DefaultApproval) {
		return fmt.Errorf("default_approval %q: want never, required or deny", f.DefaultApproval)
	}
	return firstErr(f.checkTools, f.checkGroups, f.checkDeciders, f.checkSessions, f.checkTransports)
}

func firstErr(checks ...func() error) error {
	for _, c := range checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// checkTools checks each tool's name, modes and options (its decider rules
// are checkDeciders').
func (f *File) checkTools() error {
	for name, r := range f.Tools {
		if _, isPattern := patternPrefix(name); !isPattern && !ValidToolName(name) {
			return fmt.Errorf("tool name %q: only a-z 0-9 _ - . are allowed, or a pattern \"<prefix>.*\"", name)
		}
		if !validMode(r.Approval) {
			return fmt.Errorf("tool %s: approval %q: want never, required or deny", name, r.Approval)
		}
		for a, m := range r.Audiences {
			if !validMode(m) {
				return fmt.Errorf("tool %s: audience %s: mode %q", name, a, m)
			}
			if !validAudience(a) {
				return fmt.Errorf("tool %s: unknown audience %q", name, a)
			}
		}
		for _, o := range r.Options {
			if o != schemas.OptionApprove && o != schemas.OptionDeny {
				return fmt.Errorf("tool %s: unknown option %q (grant options go in \"grants\")", name, o)
			}
		}
		if err := checkGrants(name, r); err != nil {
			return err
		}
	}
	return nil
}

func (f *File) checkGroups() error {
	for g, members := range f.Groups {
		if len(members) == 0 {
			return fmt.Errorf("group %s is empty", g)
		}
		for _, m := range members {
			if err := checkPrincipal(m); err != nil {
				return fmt.Errorf("group %s: %w", g, err)
			}
		}
	}
	return nil
}

// checkDeciders checks every decider rule: the file's, each trust
// boundary's, each tool's and each tool audience's.
func (f *File) checkDeciders() error {
	if f.Deciders != nil {
		if err := f.checkDeciderRule("deciders", f.Deciders); err != nil {
			return err
		}
	}
	for tb, r := range f.TrustBoundaryDeciders {
		if err := f.checkDeciderRule("trust_boundary_deciders."+tb, r); err != nil {
			return err
		}
	}
	for name, r := range f.Tools {
		if r.Deciders != nil {
			if err := f.checkDeciderRule("tool "+name+" deciders", r.Deciders); err != nil {
				return err
			}
		}
		for a, dr := range r.AudienceDeciders {
			if !validAudience(a) {
				return fmt.Errorf("tool %s: audience_deciders: unknown audience %q", name, a)
			}
			if err := f.checkDeciderRule("tool "+name+" audience_deciders."+string(a), dr); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkDeciderRule checks the decider rule r found at where: its
// principals and groups exist, its assurance and quorum are in range, and
// somebody could decide (enough people for its quorum).
func (f *File) checkDeciderRule(where string, r *DeciderRule) error {
	if r == nil {
		return fmt.Errorf("%s: null decider rule", where)
	}
	for _, pr := range r.Principals {
		if err := checkPrincipal(pr); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	for _, g := range r.Groups {
		if _, ok := f.Groups[g]; !ok {
			return fmt.Errorf("%s: unknown group %q", where, g)
		}
	}
	switch r.MinAssurance {
	case "", "verified", "strong":
	default:
		return fmt.Errorf("%s: min_assurance %q: want verified or strong", where, r.MinAssurance)
	}
	if r.Quorum < 0 || r.Quorum > 16 {
		return fmt.Errorf("%s: quorum %d: want 1 to 16", where, r.Quorum)
	}
	if r.Requester != nil && !*r.Requester && len(r.Principals) == 0 && len(r.Groups) == 0 {
		return fmt.Errorf("%s: nobody may decide (requester false, no principals or groups)", where)
	}
	if n := f.mostDeciders(r); r.Quorum > 1 && r.Quorum > n {
		return fmt.Errorf("%s: quorum %d but at most %d people could decide", where, r.Quorum, n)
	}
	return nil
}

// mostDeciders is the most people who could ever decide under r: a quorum
// above it would send prompts that can never lead to the call running. It
// counts generously: every "approvers" list (tool lists are not known where
// r applies), and the requester apart from everyone else when r allows the
// requester.
func (f *File) mostDeciders(r *DeciderRule) int {
	who := map[string]bool{}
	for _, pr := range r.Principals {
		who[pr] = true
	}
	for _, g := range r.Groups {
		for _, m := range f.Groups[g] {
			who[m] = true
		}
	}
	for _, pr := range f.Approvers {
		who[pr] = true
	}
	for _, t := range f.Tools {
		for _, pr := range t.Approvers {
			who[pr] = true
		}
	}
	n := len(who)
	if r.Requester == nil || *r.Requester {
		n++
	}
	return n
}

func (f *File) checkSessions() error {
	s := f.Sessions
	if s == nil {
		return nil
	}
	if !validBusy(s.Busy) {
		return fmt.Errorf("sessions.busy %q: want queue or supersede", s.Busy)
	}
	for tr, b := range s.Transports {
		if !validBusy(b) || b == "" {
			return fmt.Errorf("sessions.transports.%s %q: want queue or supersede", tr, b)
		}
	}
	return nil
}

func (f *File) checkTransports() error {
	for name, t := range f.Transports {
		if t.TrustBoundary == "" {
			return fmt.Errorf("transport %s: trust_boundary is required", name)
		}
	}
	if f.DefaultTransport != nil && f.DefaultTransport.TrustBoundary == "" {
		return errors.New("default_transport: trust_boundary is required")
	}
	return nil
}

// compile returns the Policy of the checked file f, read from the bytes
// raw: the default approval mode filled in, and the version named by the
// file or else a digest of raw.
func compile(f File, raw []byte) *Policy {
	f.DefaultApproval = cmp.Or(f.DefaultApproval, ModeRequired)
	v := f.Version
	if v == "" {
		sum := sha256.Sum256(raw)
		v = "sha256:" + hex.EncodeToString(sum[:8])
	}
	p := &Policy{f: f, version: v}
	for name, r := range f.Tools {
		if prefix, ok := patternPrefix(name); ok {
			p.patterns = append(p.patterns, pattern{prefix: prefix, rule: r})
		}
	}
	slices.SortFunc(p.patterns, func(a, b pattern) int {
		return cmp.Or(cmp.Compare(len(b.prefix), len(a.prefix)), cmp.Compare(a.prefix, b.prefix))
	})
	return p
}

// patternPrefix returns, for a "tools" key that is a pattern "<prefix>.*"
// whose prefix is a valid tool name not ending in ".", the prefix with its
// dot ("github."), and true.
func patternPrefix(key string) (string, bool) {
	prefix, ok := strings.CutSuffix(key, ".*")
	if !ok || !ValidToolName(prefix) || strings.HasSuffix(prefix, ".") {
		return "", false
	}
	return prefix + ".", true
}

// rule returns the rule that applies to tool (see the package doc): the
// one naming it (exact), else the longest matching pattern's; ok is false
// when none applies.
func (p *Policy) rule(tool string) (r ToolRule, ok, exact bool) {
	if r, ok := p.f.Tools[tool]; ok {
		return r, true, true
	}
	for _, pt := range p.patterns {
		if len(tool) > len(pt.prefix) && strings.HasPrefix(tool, pt.prefix) {
			return pt.rule, true, false
		}
	}
	return ToolRule{}, false, false
}

// ValidToolName reports whether s can name a tool: the rule schemas applies
// to every call's tool (schemas.CheckToolName, [a-z0-9_.-]{1,64}). A policy
// entry that no call could ever match is a typo, not a rule; a call that
// names anything else is refused.
func ValidToolName(s string) bool { return schemas.CheckToolName(s) == nil }

func validAudience(a schemas.Audience) bool {
	return a == schemas.AudiencePersonal || a == schemas.AudienceTeam || a == schemas.AudiencePublic
}

// Version identifies the policy: its "version" field, or a digest of the file.
func (p *Policy) Version() string { return p.version }

// ModeFor returns how a call of tool is treated for audience, given the
// tool's claims about its effects (zero Hints: none). The rule that
// applies (see the package doc) decides; only where no rule names the tool
// exactly does a tool claiming to be destructive turn "never" into
// "required".
func (p *Policy) ModeFor(tool string, audience schemas.Audience, h tools.Hints) Mode {
	r, ok, exact := p.rule(tool)
	m := p.f.DefaultApproval
	if ok {
		m = r.Approval
		if am, ok := r.Audiences[audience]; ok {
			m = am
		}
	}
	if m == ModeNever && !exact && h.Destructive != nil && *h.Destructive {
		return ModeRequired
	}
	return m
}

// Options returns the options a prompt for tool offers.
func (p *Policy) Options(tool string) []string {
	if r, ok, _ := p.rule(tool); ok && len(r.Options) > 0 {
		return slices.Clone(r.Options)
	}
	return []string{schemas.OptionApprove, schemas.OptionDeny}
}

// ExpiresAfter returns how long an approval for tool stays answerable; 0
// means it never expires.
func (p *Policy) ExpiresAfter(tool string) time.Duration {
	d := p.f.ExpiresAfter
	if r, ok, _ := p.rule(tool); ok && r.ExpiresAfter != nil {
		d = r.ExpiresAfter
	}
	switch {
	case d == nil:
		return DefaultExpiry
	case d.None:
		return 0
	default:
		return d.D
	}
}

func validBusy(s string) bool { return s == "" || s == BusyQueue || s == BusySupersede }

// checkPrincipal accepts "transport:sender_id".
func checkPrincipal(s string) error {
	t, id, ok := strings.Cut(s, ":")
	if !ok || t == "" || id == "" || len(s) > 512 {
		return fmt.Errorf("principal %q: want transport:sender_id", s)
	}
	return nil
}

// deciderRule returns the rule that applies to approvals of tool on the
// turn of tc: the most specific of the tool's audience rule, the tool's
// rule, the trust boundary's rule, the file's rule, or the built-in one
// (the requester alone). Rules replace each other; they do not merge.
func (p *Policy) deciderRule(tool string, tc *schemas.TurnContext) DeciderRule {
	r, ok, _ := p.rule(tool)
	switch {
	case ok && r.AudienceDeciders[tc.Audience] != nil:
		return *r.AudienceDeciders[tc.Audience]
	case ok && r.Deciders != nil:
		return *r.Deciders
	case p.f.TrustBoundaryDeciders[tc.TrustBoundary] != nil:
		return *p.f.TrustBoundaryDeciders[tc.TrustBoundary]
	case p.f.Deciders != nil:
		return *p.f.Deciders
	}
	return DeciderRule{}
}

// Quorum is how many distinct qualifying deciders must approve an approval
// of tool on the turn of tc (at least 1).
func (p *Policy) Quorum(tool string, tc *schemas.TurnContext) int {
	if tc == nil {
		return 1
	}
	return max(1, p.deciderRule(tool, tc).Quorum)
}

// MayDecide reports, with nil, whether principal, vouched for by its
// transport at assurance, may decide an approval of tool on the turn whose
// persisted context is tc; otherwise an error saying why not. It consults
// only the persisted context and the policy, never what a decision claims
// beyond the principal and assurance it was delivered with. The "approvers"
// lists (file and tool) add principals to whichever rule applies.
//
// A requester that is not a person (its recorded kind is anything but
// user: a bot or a service) never decides its own turn's calls, whatever
// the decider rule or the approvers lists say: automation that asks for a
// call is never the one that lets it run (docs/security.md, "Automation
// never approves itself"). Every surface that decides, or lists who may,
// reaches this through MayDecideApproval.
func (p *Policy) MayDecide(tool string, tc *schemas.TurnContext, principal string, assurance schemas.Assurance) error {
	if tc == nil || principal == "" {
		return errors.New("no context or no principal")
	}
	if principal == tc.Requester.Principal && tc.Requester.Kind != schemas.SenderUser {
		return fmt.Errorf("%s is the requester of this turn and a %s, not a person: it never decides its own turn's calls", principal, cmp.Or(string(tc.Requester.Kind), "sender of unknown kind"))
	}
	rule := p.deciderRule(tool, tc)
	min := schemas.AssuranceVerified
	if rule.MinAssurance == "strong" {
		min = schemas.AssuranceStrong
	}
	if assurance < min {
		return fmt.Errorf("%s is vouched for at level %d, the rule needs %s", principal, assurance, cmp.Or(rule.MinAssurance, "verified"))
	}
	if principal == tc.Requester.Principal && (rule.Requester == nil || *rule.Requester) {
		return nil
	}
	if slices.Contains(rule.Principals, principal) || slices.Contains(p.f.Approvers, principal) {
		return nil
	}
	if r, ok, _ := p.rule(tool); ok && slices.Contains(r.Approvers, principal) {
		return nil
	}
	for _, g := range rule.Groups {
		if slices.Contains(p.f.Groups[g], principal) {
			return nil
		}
	}
	return fmt.Errorf("%s is not among the deciders of %s for %s's %s turn", principal, tool, tc.Requester.Principal, tc.Audience)
}

// Candidates lists who may decide an approval of tool on the turn of tc,
// judged by MayDecide (the one decider rule) over every principal the
// policy names and the turn's requester, sorted: for showing who a quorum
// still needs. min is the assurance each is judged at (a rule that needs
// a second factor lists its deciders at AssuranceStrong only).
func (p *Policy) Candidates(tool string, tc *schemas.TurnContext, min schemas.Assurance) []string {
	if tc == nil {
		return nil
	}
	named := []string{tc.Requester.Principal}
	named = append(named, p.f.Approvers...)
	for _, members := range p.f.Groups {
		named = append(named, members...)
	}
	add := func(r *DeciderRule) {
		if r != nil {
			named = append(named, r.Principals...)
		}
	}
	add(p.f.Deciders)
	for _, r := range p.f.TrustBoundaryDeciders {
		add(r)
	}
	if r, ok, _ := p.rule(tool); ok {
		named = append(named, r.Approvers...)
		add(r.Deciders)
		for _, ar := range r.AudienceDeciders {
			add(ar)
		}
	}
	slices.Sort(named)
	named = slices.Compact(named)
	return slices.DeleteFunc(named, func(pr string) bool { return p.MayDecide(tool, tc, pr, min) != nil })
}

// Busy returns the session policy for a turn arriving on transport while
// its session waits on approvals: BusyQueue or BusySupersede.
func (p *Policy) Busy(transport string) string {
	s := p.f.Sessions
	if s == nil {
		return BusyQueue
	}
	if b, ok := s.Transports[transport]; ok {
		return b
	}
	return cmp.Or(s.Busy, BusyQueue)
}

// Transport returns the rule for a transport.
func (p *Policy) Transport(name string) TransportRule {
	if r, ok := p.f.Transports[name]; ok {
		return r
	}
	if p.f.DefaultTransport != nil {
		return *p.f.DefaultTransport
	}
	return TransportRule{TrustBoundary: "external", Interactive: true}
}
