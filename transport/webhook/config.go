package webhook

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Event is a kind of event a subscriber can receive.
type Event string

// The events a subscriber can receive, named as in the body's "type".
const (
	// EventOutcome: a turn reached its terminal outcome (TurnOutcome, kept
	// by the turn log's outcome event; for a turn an earlier version ended,
	// on tollgate.event.turn.outcome.<turn>).
	EventOutcome Event = "outcome"
	// EventApprovalRequested: a call waits for a person (ApprovalRecord,
	// kept by the turn log's awaiting event; for a turn an earlier version
	// moved to awaiting, on tollgate.event.approval.requested.<turn>).
	EventApprovalRequested Event = "approval.requested"
	// EventApprovalDecided: an approval left pending: approved, denied,
	// expired or abandoned (DecidedEvent: the decision as the revision of
	// the approval's record in KV tollgate_approvals keeps it, sent as the
	// event the approver publishes on
	// tollgate.event.approval.decided.<turn>; a decision recorded before
	// the subscriber's consumer of the bucket was made, from that
	// published copy).
	EventApprovalDecided Event = "approval.decided"
)

// AllEvents are the events a subscriber without an events list receives.
var AllEvents = []Event{EventApprovalRequested, EventApprovalDecided, EventOutcome}

// Subscriber is one webhook receiver and what it is sent.
//
// It receives an event when the event's session id is one of Sessions, or
// its transport (the turn's TurnContext transport) is one of Transports; at
// least one of the two lists must be given, so that no subscriber receives
// every transport's approvals by accident.
type Subscriber struct {
	// ID names the subscriber: [a-z0-9_-]{1,64}, unique. It names its
	// durable consumers (webhook-<id> on TOLLGATE_EVENTS,
	// webhook-<id>-outcome-<i> on the turn logs, webhook-<id>-decided on
	// KV_tollgate_approvals), its dead letters (tollgate.dlq.webhook.<id>)
	// and its metrics. Keep it stable: a new id is a new set of consumers
	// that start with the events stored after them.
	ID string `json:"id"`
	// URL receives a POST per event: http or https, with a host, no user
	// information (put credentials in Headers), no white space or control
	// characters.
	URL string `json:"url"`
	// Secret signs every delivery (Standard Webhooks): "whsec_" followed
	// by the standard base64 of 24 to 64 random bytes.
	Secret string `json:"secret"`
	// Transports and Sessions select the events (see above).
	Transports []string `json:"transports,omitempty"`
	Sessions   []string `json:"sessions,omitempty"`
	// Events to send; empty is AllEvents.
	Events []Event `json:"events,omitempty"`
	// Headers are added to every request (e.g. Authorization). Names must
	// be HTTP tokens and not one the dispatcher sets (webhook-*,
	// Content-Type, Content-Length, Host, Transfer-Encoding); values may
	// not hold control characters (CR, LF, NUL, ...).
	Headers map[string]string `json:"headers,omitempty"`
}

// Retry is the retry schedule of every subscriber: after a failed attempt
// n (1-based) the next comes Base × 2^(n-1) later, at most Max later, and
// attempt number Attempts is the last.
type Retry struct {
	Attempts int           // default 15
	Base     time.Duration // default 2s
	Max      time.Duration // default 15m
}

// Defaults of Config.
const (
	DefaultTimeout       = 10 * time.Second
	DefaultRetryAttempts = 15
	DefaultRetryBase     = 2 * time.Second
	DefaultRetryMax      = 15 * time.Minute
)

// Config configures a Dispatcher.
type Config struct {
	Subscribers []Subscriber
	// Timeout bounds one delivery attempt, connection to response headers
	// and body (default DefaultTimeout).
	Timeout time.Duration
	// Retry is the schedule of later attempts (zero fields: the defaults,
	// about 90 minutes of attempts in all).
	Retry Retry
	// Client sends the requests (nil: http.DefaultTransport). Redirects
	// are never followed, whatever its CheckRedirect: a 3xx answer is a
	// failed attempt, so signed deliveries go only to the configured URL.
	Client *http.Client
	// Logger and Registerer as for every stage (nil: discard; not
	// registered).
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// fileConfig is the JSON file LoadConfig reads.
type fileConfig struct {
	Timeout     string       `json:"timeout,omitempty"`
	Retry       *fileRetry   `json:"retry,omitempty"`
	Subscribers []Subscriber `json:"subscribers"`
}

type fileRetry struct {
	Attempts int    `json:"attempts,omitempty"`
	Base     string `json:"base,omitempty"`
	Max      string `json:"max,omitempty"`
}

// LoadConfig reads a webhook configuration file (JSON; see docs/api.md,
// Webhooks) and validates it. Unknown fields, trailing data, a duration
// that is not a Go duration and everything Validate refuses are errors
// that name the file and the offending field. Logger, Registerer and
// Client are the caller's to set.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("webhook config: %w", err)
	}
	cfg, err := parseConfig(b)
	if err != nil {
		return Config{}, fmt.Errorf("webhook config %s: %w", path, err)
	}
	return cfg, nil
}

func parseConfig(b []byte) (Config, error) {
	var f fileConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Config{}, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("trailing data after the JSON object")
	}
	var cfg Config
	var err error
	if cfg.Timeout, err = duration("timeout", f.Timeout); err != nil {
		return Config{}, err
	}
	if r := f.Retry; r != nil {
		cfg.Retry.Attempts = r.Attempts
		if cfg.Retry.Base, err = duration("retry.base", r.Base); err != nil {
			return Config{}, err
		}
		if cfg.Retry.Max, err = duration("retry.max", r.Max); err != nil {
			return Config{}, err
		}
	}
	cfg.Subscribers = f.Subscribers
	return cfg, cfg.Validate()
}

// duration parses an optional positive Go duration ("" is zero: the default).
func duration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive Go duration such as \"10s\"", field, s)
	}
	return d, nil
}

// withDefaults returns c with its zero fields set to the defaults.
func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Retry.Attempts == 0 {
		c.Retry.Attempts = DefaultRetryAttempts
	}
	if c.Retry.Base == 0 {
		c.Retry.Base = DefaultRetryBase
	}
	if c.Retry.Max == 0 {
		c.Retry.Max = DefaultRetryMax
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first thing wrong with c (zero durations and
// attempts are the defaults).
func (c Config) Validate() error {
	switch {
	case c.Timeout < 0:
		return errors.New("timeout must not be negative")
	case c.Retry.Attempts < 0:
		return errors.New("retry.attempts must not be negative")
	case c.Retry.Base < 0 || c.Retry.Max < 0:
		return errors.New("retry.base and retry.max must not be negative")
	}
	if d := c.withDefaults(); d.Retry.Base > d.Retry.Max {
		return fmt.Errorf("retry.base %v is longer than retry.max %v", d.Retry.Base, d.Retry.Max)
	}
	seen := map[string]bool{}
	for i, s := range c.Subscribers {
		if err := s.validate(); err != nil {
			if s.ID != "" && idRE.MatchString(s.ID) {
				return fmt.Errorf("subscriber %q: %w", s.ID, err)
			}
			return fmt.Errorf("subscribers[%d]: %w", i, err)
		}
		if seen[s.ID] {
			return fmt.Errorf("subscriber %q: id used twice", s.ID)
		}
		seen[s.ID] = true
	}
	return nil
}

// idRE is the rule for subscriber ids and transport names: one NATS
// subject token and a valid durable name.
var idRE = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// reserved are the request headers the dispatcher sets itself.
var reserved = map[string]bool{
	"Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
	"Content-Type": true, "Content-Length": true, "Host": true, "Transfer-Encoding": true,
}

func (s Subscriber) validate() error {
	if !idRE.MatchString(s.ID) {
		return fmt.Errorf("id %q: want [a-z0-9_-]{1,64}", s.ID)
	}
	if err := checkURL(s.URL); err != nil {
		return err
	}
	if _, err := secretKey(s.Secret); err != nil {
		return err
	}
	if len(s.Transports) == 0 && len(s.Sessions) == 0 {
		return errors.New("give transports, sessions or both: a subscriber receives only the events of the transports and sessions it names")
	}
	for _, t := range s.Transports {
		if !idRE.MatchString(t) {
			return fmt.Errorf("transport %q: want a transport name, [a-z0-9_-]{1,64}", t)
		}
	}
	for _, id := range s.Sessions {
		if id == "" || len(id) > 256 || !utf8.ValidString(id) || strings.IndexFunc(id, unicode.IsControl) >= 0 {
			return fmt.Errorf("session %q: want a session id of 1 to 256 bytes of UTF-8 without control characters", id)
		}
	}
	for _, e := range s.Events {
		if !known(e) {
			return fmt.Errorf("event %q: want one of %v", e, AllEvents)
		}
	}
	for k, v := range s.Headers {
		if err := checkHeader(k, v); err != nil {
			return err
		}
	}
	return nil
}

func known(e Event) bool {
	for _, k := range AllEvents {
		if e == k {
			return true
		}
	}
	return false
}

// checkURL accepts an absolute http or https URL with a host and without
// user information. White space and control characters anywhere (a CR or
// LF would split the request, or a header it is copied into) are refused
// before the URL is parsed, with their position.
func checkURL(raw string) error {
	if raw == "" {
		return errors.New("url is required")
	}
	for i, r := range raw {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("url: white space or control character %U at byte %d (header injection is refused)", r, i)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url: %w", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("url %q: scheme must be http or https", u.Redacted())
	case u.Host == "":
		return fmt.Errorf("url %q: a host is required", u.Redacted())
	case u.User != nil:
		return fmt.Errorf("url %q: user information is not allowed in the URL; send credentials in headers", u.Redacted())
	}
	return nil
}

// checkHeader accepts a header a subscriber adds: an HTTP token as its
// name (RFC 9110 tchar) that the dispatcher does not set itself, and a
// value without control characters other than tab.
func checkHeader(name, value string) error {
	if name == "" || strings.IndexFunc(name, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
		return fmt.Errorf("header name %q: want an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", name)
	}
	if reserved[http.CanonicalHeaderKey(name)] {
		return fmt.Errorf("header %q is set by the dispatcher and cannot be configured", name)
	}
	if !utf8.ValidString(value) {
		return fmt.Errorf("header %q: value is not valid UTF-8", name)
	}
	for i, r := range value {
		if r != '\t' && unicode.IsControl(r) {
			return fmt.Errorf("header %q: control character %U at byte %d of its value (header injection is refused)", name, r, i)
		}
	}
	return nil
}

func isTokenChar(r rune) bool {
	return r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}

// secretPrefix starts every Standard Webhooks secret.
const secretPrefix = "whsec_"

// secretKey returns the HMAC key of a "whsec_<base64>" secret: its
// base64-decoded bytes, 24 to 64 of them.
func secretKey(secret string) ([]byte, error) {
	enc, ok := strings.CutPrefix(secret, secretPrefix)
	if !ok {
		return nil, errors.New(`secret: want "whsec_" followed by base64`)
	}
	key, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, errors.New(`secret: the part after "whsec_" is not standard base64`)
	}
	if len(key) < 24 || len(key) > 64 {
		return nil, fmt.Errorf("secret: %d bytes after decoding, want 24 to 64", len(key))
	}
	return key, nil
}
