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
package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Mode is how a tool call is treated.
type Mode string

const (
	ModeNever    Mode = "never"    // runs without approval
	ModeRequired Mode = "required" // waits for an approval
	ModeDeny     Mode = "deny"     // never runs
)

func (m Mode) valid() bool { return m == ModeNever || m == ModeRequired || m == ModeDeny }

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
}

// Policy is a validated, immutable policy.
type Policy struct {
	f       File
	version string
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

// Parse parses and validates a policy. Unknown JSON fields are rejected so a
// typo cannot silently weaken a rule.
func Parse(b []byte) (*Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse policy: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("parse policy: trailing data after the policy object")
	}
	if f.DefaultApproval == "" {
		f.DefaultApproval = ModeRequired
	}
	if !f.DefaultApproval.valid() {
		return nil, fmt.Errorf("parse policy: default_approval %q: want never, required or deny", f.DefaultApproval)
	}
	for name, r := range f.Tools {
		if !validName(name) {
			return nil, fmt.Errorf("parse policy: tool name %q: only a-z 0-9 _ - . are allowed", name)
		}
		if !r.Approval.valid() {
			return nil, fmt.Errorf("parse policy: tool %s: approval %q: want never, required or deny", name, r.Approval)
		}
		for a, m := range r.Audiences {
			if !m.valid() {
				return nil, fmt.Errorf("parse policy: tool %s: audience %s: mode %q", name, a, m)
			}
			if a != schemas.AudiencePersonal && a != schemas.AudienceTeam && a != schemas.AudiencePublic {
				return nil, fmt.Errorf("parse policy: tool %s: unknown audience %q", name, a)
			}
		}
		for _, o := range r.Options {
			if o != schemas.OptionApprove && o != schemas.OptionDeny {
				return nil, fmt.Errorf("parse policy: tool %s: unknown option %q", name, o)
			}
		}
	}
	for name, t := range f.Transports {
		if t.TrustBoundary == "" {
			return nil, fmt.Errorf("parse policy: transport %s: trust_boundary is required", name)
		}
	}
	if f.DefaultTransport != nil && f.DefaultTransport.TrustBoundary == "" {
		return nil, fmt.Errorf("parse policy: default_transport: trust_boundary is required")
	}
	v := f.Version
	if v == "" {
		sum := sha256.Sum256(b)
		v = "sha256:" + hex.EncodeToString(sum[:8])
	}
	return &Policy{f: f, version: v}, nil
}

// validName mirrors the tool-name rule of schemas: [a-z0-9_.-]{1,64}. A
// policy entry that no call could ever match is a typo, not a rule.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Version identifies the policy: its "version" field, or a digest of the file.
func (p *Policy) Version() string { return p.version }

// ModeFor returns how a call of tool is treated for audience.
func (p *Policy) ModeFor(tool string, audience schemas.Audience) Mode {
	r, ok := p.f.Tools[tool]
	if !ok {
		return p.f.DefaultApproval
	}
	if m, ok := r.Audiences[audience]; ok {
		return m
	}
	return r.Approval
}

// Options returns the options a prompt for tool offers.
func (p *Policy) Options(tool string) []string {
	if r, ok := p.f.Tools[tool]; ok && len(r.Options) > 0 {
		return slices.Clone(r.Options)
	}
	return []string{schemas.OptionApprove, schemas.OptionDeny}
}

// ExpiresAfter returns how long an approval for tool stays answerable; 0
// means it never expires.
func (p *Policy) ExpiresAfter(tool string) time.Duration {
	d := p.f.ExpiresAfter
	if r, ok := p.f.Tools[tool]; ok && r.ExpiresAfter != nil {
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

// MayDecide reports whether principal may decide an approval of tool on the
// turn whose persisted context is tc: the requester, or an approver named by
// the policy for that tool or globally. It never consults anything the
// decision itself claims beyond the principal it was delivered under.
func (p *Policy) MayDecide(tool string, tc *schemas.TurnContext, principal string) bool {
	if tc == nil || principal == "" {
		return false
	}
	if principal == tc.Requester.Principal {
		return true
	}
	if slices.Contains(p.f.Approvers, principal) {
		return true
	}
	r, ok := p.f.Tools[tool]
	return ok && slices.Contains(r.Approvers, principal)
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
