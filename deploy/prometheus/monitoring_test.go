// Package monitoring_test checks the alerting rules (deploy/prometheus) and
// the Grafana dashboard (deploy/grafana) against what Tollgate really is:
//
//   - promtool validates alerts.yml and runs its unit tests, alerts_test.yml;
//   - every alert has a severity, a summary, a description and a runbook
//     section in docs/operations.md, and unit tests where it fires and where
//     it stays silent;
//   - every metric the rules and the dashboard query is exported by a
//     Tollgate binary, as gathered from a running pipeline, or is one of the
//     few listed in external with the exporter it comes from.
//
// promtool comes from Debian's prometheus package. Without it the promtool
// test is skipped, or fails where CI=true.
package monitoring_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/health"
	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

const (
	rulesFile     = "alerts.yml"
	rulesTestFile = "alerts_test.yml"
	dashboardFile = "../grafana/tollgate.json"
	runbookFile   = "../../docs/operations.md"
)

// external are the metrics the rules and the dashboard use that no Tollgate
// binary exports, each with where it comes from. Tollgate does not export
// consumer lag or stream sizes: the broker knows them, and
// prometheus-nats-exporter (github.com/nats-io/prometheus-nats-exporter,
// collector/jsz.go) reads them from the nats-server monitoring port.
var external = map[string]string{
	"up":                                 "Prometheus itself, one series per scrape target: a target that cannot be scraped is not ready",
	"jetstream_consumer_num_pending":     "prometheus-nats-exporter -jsz=consumers: messages a consumer has not yet delivered (lag)",
	"jetstream_consumer_num_ack_pending": "prometheus-nats-exporter -jsz=consumers: messages delivered and not yet acknowledged",
	"jetstream_stream_total_messages":    "prometheus-nats-exporter -jsz=streams: messages a stream holds (TOLLGATE_DLQ)",
}

func TestRulesPassPromtool(t *testing.T) {
	promtool := promtoolPath(t)
	t.Run("the rules are valid, and this test reads them all", func(t *testing.T) {
		out := run(t, promtool, "check", "rules", rulesFile)
		m := regexp.MustCompile(`SUCCESS: (\d+) rules found`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no rule count in promtool's output:\n%s", out)
		}
		if n, _ := strconv.Atoi(string(m[1])); n != len(readRules(t)) {
			t.Fatalf("promtool found %d rules, this test reads %d alerts from %s", n, len(readRules(t)), rulesFile)
		}
	})
	t.Run("the unit tests of every alert pass", func(t *testing.T) {
		run(t, promtool, "test", "rules", rulesTestFile)
	})
}

// run runs a command and returns its output; it fails the test if the
// command fails.
func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return out
}

// promtoolPath finds promtool, or skips the test (fails it where CI=true).
func promtoolPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	const msg = "promtool not found: install Debian's prometheus package (apt-get install prometheus)"
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s; CI=true, so the alerting rules must be checked: %v", msg, err)
	}
	t.Skip(msg)
	return ""
}

func TestEveryAlertIsDocumentedAndTested(t *testing.T) {
	rules := readRules(t)
	if len(rules) == 0 {
		t.Fatalf("no alerts read from %s", rulesFile)
	}
	anchors := headingAnchors(t, runbookFile)
	cases := alertTestCases(t)
	for _, r := range rules {
		t.Run(r.Alert, func(t *testing.T) {
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("severity %q, want critical or warning", s)
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("no %s annotation", a)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], "docs/operations.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("runbook_url %q does not name a section of docs/operations.md", r.Annotations["runbook_url"])
			}
			if c := cases[r.Alert]; c.fires == 0 || c.silent == 0 {
				t.Errorf("%s has %d case(s) where the alert fires and %d where it stays silent; want at least one of each", rulesTestFile, c.fires, c.silent)
			}
		})
	}
	for name := range cases {
		if !slices.ContainsFunc(rules, func(r rule) bool { return r.Alert == name }) {
			t.Errorf("%s tests %s, which %s does not define", rulesTestFile, name, rulesFile)
		}
	}
}

func TestDashboard(t *testing.T) {
	var d struct {
		UID           string `json:"uid"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(readFile(t, dashboardFile), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.SchemaVersion < 39 {
		t.Errorf("uid %q, schemaVersion %d: want a uid and schemaVersion 39 or later", d.UID, d.SchemaVersion)
	}
	// The only variable is the data source: no PromQL hides in variable
	// queries, where TestQueriesUseExportedMetrics would not look.
	if len(d.Templating.List) != 1 || d.Templating.List[0].Type != "datasource" || d.Templating.List[0].Query != "prometheus" {
		t.Errorf("templating %+v, want one variable: a Prometheus data source", d.Templating.List)
	}
	ids := map[int]bool{}
	var titles []string
	for _, p := range dashboardPanels(t) {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		titles = append(titles, p.Title)
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want the ${datasource} variable", p.Title, p.Datasource.UID)
		}
		if p.Description == "" || len(p.Targets) == 0 {
			t.Errorf("panel %q: want a description and at least one query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q, query %s: empty, or not on the ${datasource} variable", p.Title, tg.RefID)
			}
		}
	}
	for _, want := range []string{"Turn rate", "Approval backlog and age", "Decision latency", "Redrive outcomes", "Dead letters", "Consumer lag", "Sweep actions"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q (panels: %q)", want, titles)
		}
	}
}

func TestQueriesUseExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	queries := map[string][]string{} // source -> PromQL expressions
	for _, r := range readRules(t) {
		queries[rulesFile+" "+r.Alert] = append(queries[rulesFile+" "+r.Alert], r.Expr)
	}
	for _, p := range dashboardPanels(t) {
		for _, tg := range p.Targets {
			queries[dashboardFile+" "+p.Title] = append(queries[dashboardFile+" "+p.Title], tg.Expr)
		}
	}
	used := map[string]bool{}
	tollgate := 0
	for src, exprs := range queries {
		for _, e := range exprs {
			names := metricNames(e)
			if len(names) == 0 {
				t.Errorf("%s: no metric found in %q", src, e)
			}
			for _, n := range names {
				used[n] = true
				switch {
				case exported[n] != nil:
					tollgate++
				case external[n] != "":
				default:
					t.Errorf("%s uses %s, which no Tollgate binary exports and which is not listed in external", src, n)
				}
			}
			for _, m := range promqlSelectors.FindAllStringSubmatch(e, -1) {
				labels := exported[m[1]]
				for _, l := range promqlMatcherLabels.FindAllStringSubmatch(m[2], -1) {
					if labels != nil && !labels[l[1]] {
						t.Errorf("%s selects %s by label %s, which it does not have", src, m[1], l[1])
					}
				}
			}
		}
	}
	if tollgate == 0 {
		t.Error("no query uses a Tollgate metric: the reading of queries is broken")
	}
	for n := range external {
		if !used[n] {
			t.Errorf("external lists %s, which nothing uses any more", n)
		}
		if exported[n] != nil {
			t.Errorf("external lists %s, which Tollgate exports itself", n)
		}
	}
}

// exportedMetrics returns the sample names Tollgate's binaries export, each
// with its label names: those
// of a running pipeline, built by tollgate.New as every binary is, after one
// approval turn, a look of the recovery sweep and a dead letter (a labelled
// metric shows only once it has a series), plus the Go and process
// collectors every binary adds (scaffold.NewRegistry). A histogram or
// summary contributes its _bucket, _sum and _count series.
func exportedMetrics(t *testing.T) map[string]map[string]bool {
	t.Helper()
	h := pt.Start(t, pt.Options{SweepInterval: 100 * time.Millisecond, SweepAfter: 300 * time.Millisecond})
	turn := h.Send(h.Inbound("dashboards", "alice", pt.Call("write_file", `{"path":"dashboards.txt","content":"x"}`)))
	id := schemas.ApprovalID(turn, 0)
	h.WaitPending(id)
	jstest.Eventually(t, pt.Wait, "the sweep looked at the batch waiting for a person", func() bool {
		return h.Metric("tollgate_sweep_actions_total", map[string]string{"action": "waiting"}) >= 1
	})
	h.Decide(id, schemas.OptionApprove, "alice")
	if out := h.WaitOutcome(turn); len(out.Results) != 1 || out.Results[0].Status != schemas.ResultOK {
		t.Fatalf("approval turn: outcome %+v, want one ok result", out)
	}
	h.PublishRaw(topology.InboundSubject("cli", "dashboards"), "", []byte("not a message"), nil)
	h.WaitDLQ(pt.Ingest, 1)
	jstest.Eventually(t, pt.Wait, "the dead letter counted", func() bool {
		return h.Metric("tollgate_messages_dead_lettered_total", map[string]string{"stage": pt.Ingest}) >= 1
	})

	names := map[string]map[string]bool{}
	add := func(name string, labels map[string]bool, extra ...string) {
		if names[name] == nil {
			names[name] = map[string]bool{}
		}
		for l := range labels {
			names[name][l] = true
		}
		for _, l := range extra {
			names[name][l] = true
		}
	}
	// Readiness, as every binary registers it next to its stages' metrics.
	ready := prometheus.NewRegistry()
	if _, err := health.New(ready, pt.Executor); err != nil {
		t.Fatal(err)
	}
	for _, g := range []prometheus.Gatherer{h.Registry, scaffold.NewRegistry(), ready} {
		mfs, err := g.Gather()
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		for _, mf := range mfs {
			n, labels := mf.GetName(), map[string]bool{}
			for _, m := range mf.GetMetric() {
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = true
				}
			}
			switch mf.GetType().String() {
			case "HISTOGRAM", "GAUGE_HISTOGRAM":
				add(n+"_bucket", labels, "le")
				add(n+"_sum", labels)
				add(n+"_count", labels)
			case "SUMMARY":
				add(n, labels, "quantile")
				add(n+"_sum", labels)
				add(n+"_count", labels)
			default:
				add(n, labels)
			}
		}
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		name, expr string
		want       []string
	}{
		{"a bare metric", `tollgate_approvals_pending`, []string{"tollgate_approvals_pending"}},
		{"label values and ranges are not metrics", `rate(tollgate_acked_total{stage="ingest", code=~"a|b"}[$__rate_interval])`, []string{"tollgate_acked_total"}},
		{"grouping labels are not metrics", `histogram_quantile(0.95, sum by (le, stage) (rate(x_bucket[5m])))`, []string{"x_bucket"}},
		{"binary operators, on and unless", `max by (c) (a{s=~"T.*"}) > 0 unless on (c) label_replace(sum by (stage) (rate(b[5m])) > 0, "c", "$1", "stage", "(.+)")`, []string{"a", "b"}},
		{"offset and keywords", `sum(increase(a[15m])) > 0 or sum(b unless b offset 15m) and bool c`, []string{"a", "b", "c"}},
		{"numbers with exponents", `a > 1e3 and b < 2.5e-1`, []string{"a", "b"}},
		{"a function with no metric", `absent(up{job="x"}) * vector(1)`, []string{"up"}},
		{"grafana variables", `sum(rate(a[$__rate_interval])) / $scale`, []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
				t.Fatalf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
}

var (
	promqlStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	grafanaVars    = regexp.MustCompile(`\$\{?\w+\}?`)
	promqlMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlOffsets  = regexp.MustCompile(`\boffset\s+-?\w+`)
	promqlTokens   = regexp.MustCompile(`[0-9][0-9a-zA-Z_.]*(?:[eE][+-]?[0-9]+)?|[a-zA-Z_:][a-zA-Z0-9_:]*(?:\s*\()?`)
	// promqlSelectors finds name{matchers}; promqlMatcherLabels the label
	// names in the matchers.
	promqlSelectors     = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	promqlMatcherLabels = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promqlNonMetric     = []string{"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "atan2", "inf", "nan"}
)

// metricNames returns the metric names expr selects, sorted, without
// repeats: what is left of the identifiers once strings, Grafana
// variables, label matchers, ranges, grouping label lists, offsets,
// numbers, keywords and calls (a name followed by "(") are taken out.
func metricNames(expr string) []string {
	for _, re := range []*regexp.Regexp{promqlStrings, grafanaVars, promqlMatchers, promqlRanges, promqlGrouping, promqlOffsets} {
		expr = re.ReplaceAllString(expr, " ")
	}
	var names []string
	for _, tok := range promqlTokens.FindAllString(expr, -1) {
		if tok[0] >= '0' && tok[0] <= '9' || strings.HasSuffix(tok, "(") || slices.Contains(promqlNonMetric, strings.ToLower(tok)) {
			continue
		}
		names = append(names, tok)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// rule is one alerting rule of alerts.yml.
type rule struct {
	Alert, Expr         string
	Labels, Annotations map[string]string
}

// readRules reads the alerting rules of alerts.yml. It reads the subset of
// YAML the file is written in (a rule starts with "- alert:"; expr is one
// line or a block scalar; labels and annotations are maps of scalars), and
// TestRulesPassPromtool checks that it finds as many rules as promtool.
func readRules(t *testing.T) []rule {
	t.Helper()
	var (
		rules    []rule
		section  map[string]string // labels or annotations of the rule being read
		keyDepth int               // indentation of the rule's keys
		block    *string           // a block scalar being read into
	)
	lines := strings.Split(string(readFile(t, rulesFile)), "\n")
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		depth := len(line) - len(strings.TrimLeft(line, " "))
		if block != nil {
			if trimmed == "" || depth > keyDepth {
				*block += strings.TrimSpace(line) + "\n"
				continue
			}
			block = nil
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if name, ok := strings.CutPrefix(trimmed, "- alert:"); ok {
			rules = append(rules, rule{Alert: strings.TrimSpace(name), Labels: map[string]string{}, Annotations: map[string]string{}})
			keyDepth, section = depth+2, nil
			continue
		}
		if len(rules) == 0 {
			continue
		}
		r := &rules[len(rules)-1]
		key, value, ok := strings.Cut(trimmed, ":")
		if !ok {
			t.Fatalf("%s:%d: not a key: value line: %q", rulesFile, i+1, line)
		}
		value = strings.TrimSpace(value)
		switch {
		case depth == keyDepth && key == "labels":
			section = r.Labels
		case depth == keyDepth && key == "annotations":
			section = r.Annotations
		case depth == keyDepth && key == "expr" && (value == "|" || value == "|-" || value == ">" || value == ">-"):
			block, section = &r.Expr, nil
		case depth == keyDepth && key == "expr":
			r.Expr, section = unquote(t, value), nil
		case depth == keyDepth:
			section = nil
		case depth > keyDepth && section != nil:
			section[key] = unquote(t, value)
		default:
			t.Fatalf("%s:%d: unexpected line in rule %s: %q", rulesFile, i+1, r.Alert, line)
		}
	}
	return rules
}

// unquote reads a YAML scalar: plain, or in double quotes.
func unquote(t *testing.T, s string) string {
	t.Helper()
	if !strings.HasPrefix(s, `"`) {
		return s
	}
	u, err := strconv.Unquote(s)
	if err != nil {
		t.Fatalf("%s: cannot read the scalar %s: %v", rulesFile, s, err)
	}
	return u
}

// alertCases counts the unit tests of one alert.
type alertCases struct{ fires, silent int }

// alertTestCases counts, per alert, the cases of alerts_test.yml that
// expect it to fire (exp_alerts lists alerts) and to stay silent
// (exp_alerts: []). Each alertname line must be followed by exp_alerts.
func alertTestCases(t *testing.T) map[string]alertCases {
	t.Helper()
	text := string(readFile(t, rulesTestFile))
	re := regexp.MustCompile(`(?m)^\s*alertname:\s*(\S+)\s*\n\s*exp_alerts:[ \t]*(\S*)`)
	cases := map[string]alertCases{}
	matches := re.FindAllStringSubmatch(text, -1)
	for _, m := range matches {
		c := cases[m[1]]
		if m[2] == "[]" {
			c.silent++
		} else {
			c.fires++
		}
		cases[m[1]] = c
	}
	if n := strings.Count(text, "alertname:"); n != len(matches) {
		t.Fatalf("%s: %d alertname lines, %d followed by exp_alerts", rulesTestFile, n, len(matches))
	}
	return cases
}

// panel is a dashboard panel, as far as these tests look at it.
type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

// dashboardPanels returns every panel of the dashboard, those inside
// collapsed rows included.
func dashboardPanels(t *testing.T) []panel {
	t.Helper()
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(readFile(t, dashboardFile), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var all []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if len(all) == 0 {
		t.Fatalf("%s has no panels", dashboardFile)
	}
	return all
}

// headingAnchors returns the anchors GitHub gives the headings of a
// markdown file: lower case, spaces to hyphens, other punctuation dropped.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(string(readFile(t, path)), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		anchors[strings.ReplaceAll(drop.ReplaceAllString(h, ""), " ", "-")] = true
	}
	return anchors
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
