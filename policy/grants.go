package policy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// GrantRule is one grant option a tool's prompts offer beside approve and
// deny (docs/protocol.md, "Grants"). Choosing it decides the approval with
// the option's effect and creates a standing grant that decides the
// requester's later calls of the tool inside its scope, without a prompt,
// until it expires or is revoked.
//
//	{"option": "approve-notes-folder", "scope": "requester", "for": "24h", "path_prefix": "path"}
type GrantRule struct {
	// Option names the option: "approve-<name>" approves, "deny-<name>"
	// denies (schemas.OptionEffect).
	Option string `json:"option"`
	// Scope: "session" (the session the option was chosen in) or
	// "requester" (any session of the requester). Either way the grant
	// covers only the requester's own calls, on the same transport and
	// trust boundary, in an audience no wider than the turn's.
	Scope string `json:"scope"`
	// For is how long the grant lasts: default DefaultGrantFor; "none" is
	// refused (every grant expires).
	For *Duration `json:"for,omitempty"`
	// PathPrefix names a string argument holding a path: the grant covers
	// calls whose path lies under the directory of the path in the call it
	// was chosen on (see PathPrefixOf and PathUnder). The option is not
	// offered when that directory cannot be derived (no such argument, a
	// path with "..", a file at the root).
	PathPrefix string `json:"path_prefix,omitempty"`
	// Field names a string argument: the grant covers calls whose value of
	// it is in Values, or, without Values, equal to the value in the call
	// the option was chosen on. With Values, the option is offered only on
	// a call whose value is among them.
	Field  string   `json:"field,omitempty"`
	Values []string `json:"values,omitempty"`
	// AllowQuorum lets the option be offered on a tool whose approvals
	// need more than one decider (Quorum > 1): a grant then stands in for
	// the whole quorum. Without it such a tool is never granted.
	AllowQuorum bool `json:"allow_quorum,omitempty"`
}

// DefaultGrantFor is how long a grant lasts when its rule sets no "for".
const DefaultGrantFor = 24 * time.Hour

func (g GrantRule) duration() time.Duration {
	if g.For == nil {
		return DefaultGrantFor
	}
	return g.For.D
}

// checkGrants validates the grant options of tool name's rule r.
func checkGrants(name string, r ToolRule) error {
	seen := map[string]bool{}
	for _, g := range r.Grants {
		where := fmt.Sprintf("tool %s: grant option %q", name, g.Option)
		if !schemas.IsGrantOption(g.Option) || schemas.CheckToolName(g.Option) != nil {
			return fmt.Errorf("%s: want \"approve-<name>\" or \"deny-<name>\" (a-z, 0-9, _, - and . only)", where)
		}
		if seen[g.Option] {
			return fmt.Errorf("%s: named twice", where)
		}
		seen[g.Option] = true
		switch schemas.GrantScopeKind(g.Scope) {
		case schemas.GrantScopeSession, schemas.GrantScopeRequester:
		default:
			return fmt.Errorf("%s: scope %q: want session or requester", where, g.Scope)
		}
		if g.For != nil && g.For.None {
			return fmt.Errorf("%s: for \"none\": every grant expires", where)
		}
		if len(g.Values) > 0 && g.Field == "" {
			return fmt.Errorf("%s: values without a field", where)
		}
		if len(g.Values) > 64 {
			return fmt.Errorf("%s: more than 64 values", where)
		}
	}
	return nil
}

// Grantable reports whether the policy has any grant option for tool.
// Where it has none, no grant of tool can decide a call (StillGrants
// refuses every grant whose option the policy does not offer), so a
// caller need not look any up: the executor reads no grant index for
// such a tool.
func (p *Policy) Grantable(tool string) bool {
	r, ok, _ := p.rule(tool)
	return ok && len(r.Grants) > 0
}

// grantRule returns tool's grant rule named option.
func (p *Policy) grantRule(tool, option string) (GrantRule, bool) {
	r, ok, _ := p.rule(tool)
	if !ok {
		return GrantRule{}, false
	}
	for _, g := range r.Grants {
		if g.Option == option {
			return g, true
		}
	}
	return GrantRule{}, false
}

// GrantOffers returns what each grant option of tool would create if
// chosen on the call with arguments args of the turn tc: the options the
// prompt offers beside approve and deny, in policy order. An option is
// left out when the turn's approvals need a quorum and the rule does not
// allow it, or when its argument pattern cannot be derived from args.
func (p *Policy) GrantOffers(tool string, tc *schemas.TurnContext, args string) []schemas.GrantOffer {
	r, ok, _ := p.rule(tool)
	if !ok || len(r.Grants) == 0 || tc == nil {
		return nil
	}
	var out []schemas.GrantOffer
	for _, g := range r.Grants {
		if o, ok := p.offer(g, tool, tc, args); ok {
			out = append(out, o)
		}
	}
	return out
}

// GrantOffer is GrantOffers' offer of option, if it makes one.
func (p *Policy) GrantOffer(tool, option string, tc *schemas.TurnContext, args string) (schemas.GrantOffer, bool) {
	g, ok := p.grantRule(tool, option)
	if !ok || tc == nil {
		return schemas.GrantOffer{}, false
	}
	return p.offer(g, tool, tc, args)
}

func (p *Policy) offer(g GrantRule, tool string, tc *schemas.TurnContext, args string) (schemas.GrantOffer, bool) {
	if p.Quorum(tool, tc) > 1 && !g.AllowQuorum {
		return schemas.GrantOffer{}, false
	}
	sc := schemas.GrantScope{Kind: schemas.GrantScopeKind(g.Scope)}
	if sc.Kind == schemas.GrantScopeSession {
		sc.SessionID = tc.SessionID
	}
	if g.PathPrefix != "" {
		v, ok := stringArg(args, g.PathPrefix)
		if !ok {
			return schemas.GrantOffer{}, false
		}
		prefix, ok := PathPrefixOf(v)
		if !ok {
			return schemas.GrantOffer{}, false
		}
		sc.PathField, sc.PathPrefix = g.PathPrefix, prefix
	}
	if g.Field != "" {
		v, ok := stringArg(args, g.Field)
		if !ok {
			return schemas.GrantOffer{}, false
		}
		if len(g.Values) > 0 {
			if !slices.Contains(g.Values, v) {
				return schemas.GrantOffer{}, false
			}
			sc.Values = slices.Clone(g.Values)
		} else {
			sc.Values = []string{v}
		}
		sc.ValueField = g.Field
	}
	o := schemas.GrantOffer{Option: g.Option, Effect: schemas.OptionEffect(g.Option), Tool: tool, Scope: sc, For: g.duration()}
	o.Summary = Describe(o, tc.Requester.Principal)
	return o, true
}

// Describe says in one line what a grant of offer o covers and for how
// long, for the requester principal: what a prompt shows beside the option.
func Describe(o schemas.GrantOffer, principal string) string {
	verb := "approve"
	if o.Effect != schemas.ApprovalApproved {
		verb = "deny"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s every %s call by %s", verb, o.Tool, principal)
	if o.Scope.Kind == schemas.GrantScopeSession {
		b.WriteString(" in this session")
	} else {
		b.WriteString(" in any of their sessions")
	}
	var where []string
	if o.Scope.PathPrefix != "" {
		where = append(where, fmt.Sprintf("%s is under %s", o.Scope.PathField, o.Scope.PathPrefix))
	}
	if len(o.Scope.Values) == 1 {
		where = append(where, fmt.Sprintf("%s is %q", o.Scope.ValueField, o.Scope.Values[0]))
	} else if len(o.Scope.Values) > 1 {
		where = append(where, fmt.Sprintf("%s is one of %q", o.Scope.ValueField, o.Scope.Values))
	}
	if len(where) > 0 {
		b.WriteString(" where " + strings.Join(where, " and "))
	}
	fmt.Fprintf(&b, " (same transport and trust boundary, no wider audience), for %s", o.For)
	return b.String()
}

// StillGrants reports, with nil, whether the policy still offers grant g's
// option for its tool with the same shape of scope (scope kind, the
// arguments its patterns apply to, a value set no larger than the rule's)
// and lets g's principal decide the tool on g's turn; otherwise an error
// with code GRANT_REVOKED saying what changed: a policy change that removes
// or narrows the option ends the grants made with it. It also returns the
// grant's effective expiry: the earlier of g's own and its creation plus
// the rule's current duration (a shortened "for" applies to grants already
// made).
func (p *Policy) StillGrants(g *schemas.Grant) (time.Time, error) {
	changed := func(format string, args ...any) (time.Time, error) {
		return time.Time{}, schemas.Errorf(schemas.CodeGrantRevoked, "policy %s %s (grant %s was made under %s)", p.Version(), fmt.Sprintf(format, args...), g.GrantID, g.PolicyVersion)
	}
	r, ok := p.grantRule(g.Tool, g.Option)
	switch {
	case !ok:
		return changed("no longer offers option %s for %s", g.Option, g.Tool)
	case string(g.Scope.Kind) != r.Scope:
		return changed("offers %s with scope %s, not %s", g.Option, r.Scope, g.Scope.Kind)
	case g.Scope.PathField != r.PathPrefix:
		return changed("offers %s with a path prefix of %q, not %q", g.Option, r.PathPrefix, g.Scope.PathField)
	case g.Scope.ValueField != r.Field:
		return changed("offers %s with values of %q, not %q", g.Option, r.Field, g.Scope.ValueField)
	case len(r.Values) > 0 && slices.ContainsFunc(g.Scope.Values, func(v string) bool { return !slices.Contains(r.Values, v) }):
		return changed("no longer lists every value of grant %s", g.GrantID)
	case p.Quorum(g.Tool, g.Context) > 1 && !r.AllowQuorum:
		return changed("needs a quorum for %s and does not allow it to be granted", g.Tool)
	case p.ModeFor(g.Tool, g.Context.Audience, tools.Hints{}) == ModeDeny:
		return changed("denies %s for a %s audience", g.Tool, g.Context.Audience)
	}
	if err := p.MayDecide(g.Tool, g.Context, g.Principal, max(g.Assurance, schemas.AssuranceVerified)); err != nil {
		return changed("no longer lets the grant's principal decide: %v", err)
	}
	until := g.ExpiresAt
	if cap := g.CreatedAt.Add(r.duration()); cap.Before(until) {
		until = cap
	}
	return until, nil
}

// stringArg returns the string value of top-level argument name of the
// JSON object args.
func stringArg(args, name string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader([]byte(args)))
	var m map[string]json.RawMessage
	if err := dec.Decode(&m); err != nil {
		return "", false
	}
	raw, ok := m[name]
	if !ok {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// StringArg is stringArg for the grant matcher (pipeline/grants).
func StringArg(args, name string) (string, bool) { return stringArg(args, name) }

// hasDotDot reports whether p has a ".." segment.
func hasDotDot(p string) bool {
	return slices.Contains(strings.Split(p, "/"), "..")
}

// cleanPath is p cleaned (path.Clean), or false when p is empty, holds a
// NUL or a backslash, or has a ".." segment before or after cleaning: such
// a path is never matched against a grant.
func cleanPath(p string) (string, bool) {
	if p == "" || strings.ContainsAny(p, "\x00\\") || hasDotDot(p) {
		return "", false
	}
	c := path.Clean(p)
	if hasDotDot(c) || c == "." || c == "/" {
		return "", false
	}
	return c, true
}

// PathPrefixOf derives the prefix a path grant offers from the path p of
// the call it is chosen on: the directory of the cleaned path, ending in
// "/" ("notes/a.txt" gives "notes/", "/srv/x/y" gives "/srv/x/"). There is
// none (false) for a path cleanPath refuses or a file at the top ("a.txt",
// "/a.txt"): a grant on everything is not offered.
func PathPrefixOf(p string) (string, bool) {
	c, ok := cleanPath(p)
	if !ok {
		return "", false
	}
	dir := path.Dir(c)
	if dir == "." || dir == "/" {
		return "", false
	}
	return dir + "/", true
}

// PathUnder reports whether path p lies under prefix (which ends in "/"):
// p is cleaned, refused with any ".." segment before or after cleaning,
// and must then start with prefix; an absolute path matches only an
// absolute prefix and a relative one only a relative prefix. So "notes/"
// covers "notes/a.txt" and "notes/x/../b", not "notes2/a", "notes",
// "notes/../x" or "../etc".
func PathUnder(p, prefix string) bool {
	if !strings.HasSuffix(prefix, "/") || len(prefix) < 2 {
		return false
	}
	c, ok := cleanPath(p)
	if !ok || strings.HasPrefix(c, "/") != strings.HasPrefix(prefix, "/") {
		return false
	}
	return strings.HasPrefix(c, prefix)
}
