// Package compose checks deploy/compose (the single-host deployment:
// compose.yaml and the NATS, Prometheus and Grafana files it mounts) and
// the repository's Dockerfile without a Docker daemon: every Tollgate
// service runs a binary the image builds, with flags and TOLLGATE_*
// variables that binary takes; the NATS nodes load in nats-server as one
// three-node cluster that syncs always, with every user the services log
// in as; Prometheus scrapes every binary and loads the alert rules;
// Grafana gets the dashboard.
package compose

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/internal/flagset"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

// repoRoot is the repository's root, from this directory.
const repoRoot = "../.."

type composeFile struct {
	Services map[string]service `yaml:"services"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
	Volumes map[string]any `yaml:"volumes"`
}

type service struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   dependsOn         `yaml:"depends_on"`
	Secrets     []string          `yaml:"secrets"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// dependsOn is depends_on in either form: a list of names (condition
// service_started) or a map of names to their condition.
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	if n.Kind == yaml.SequenceNode {
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			(*d)[name] = "service_started"
		}
		return nil
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for name, c := range m {
		(*d)[name] = c.Condition
	}
	return nil
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if len(f.Services) == 0 {
		t.Fatal("compose.yaml has no services")
	}
	return f
}

// tollgateServices are the services that run the Tollgate image, by name.
func (f composeFile) tollgateServices() map[string]service {
	out := map[string]service{}
	for name, s := range f.Services {
		if strings.Contains(s.Image, "TOLLGATE_IMAGE") {
			out[name] = s
		}
	}
	return out
}

// component is the Tollgate component a service runs and its arguments:
// `tollgate NAME args...` (the one binary), or a component's own binary
// `NAME args...`; for an operator command (`tollgate provision`) it is the
// command's name.
func (s service) component() (name string, args []string) {
	switch {
	case len(s.Command) == 0:
		return "", nil
	case s.Command[0] == "tollgate" && len(s.Command) > 1:
		return s.Command[1], s.Command[2:]
	}
	return s.Command[0], s.Command[1:]
}

// natsNodes are the services that run nats-server, by name.
func (f composeFile) natsNodes() map[string]service {
	out := map[string]service{}
	for name, s := range f.Services {
		if len(s.Command) > 0 && s.Command[0] == "nats-server" {
			out[name] = s
		}
	}
	return out
}

// binds are a service's bind mounts: container path -> host path (relative
// to this directory). Named volumes are left out.
func (s service) binds() map[string]string {
	out := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && (strings.HasPrefix(parts[0], ".") || strings.HasPrefix(parts[0], "/")) {
			out[parts[1]] = parts[0]
		}
	}
	return out
}

// layOut copies s's bind mounts into a fresh directory at their container
// paths (a directory mount copied whole) and returns that directory, the
// container's root.
func layOut(t *testing.T, s service) string {
	t.Helper()
	root := t.TempDir()
	for dst, src := range s.binds() {
		err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			target := filepath.Join(root, dst, rel)
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o644)
		})
		if err != nil {
			t.Fatalf("bind mount %s:%s: %v", src, dst, err)
		}
	}
	return root
}

// interpolatedVar matches a compose interpolation, "${NAME}" or
// "${NAME:?message}"; its group is NAME.
var interpolatedVar = regexp.MustCompile(`\$\{([A-Z0-9_]+)(?:[:?\-][^}]*)?\}`)

// natsLogins are the (user, password variable) pairs and the hosts of a
// comma-separated list of NATS URLs whose passwords are interpolated.
func natsLogins(t *testing.T, urls string) (users, pwVars, hosts []string) {
	t.Helper()
	for _, raw := range strings.Split(urls, ",") {
		m := interpolatedVar.FindStringSubmatch(raw)
		if m == nil {
			t.Fatalf("NATS URL %q: no interpolated password", raw)
		}
		u, err := url.Parse(strings.Replace(raw, m[0], "PASSWORD", 1))
		if err != nil {
			t.Fatalf("NATS URL %q: %v", raw, err)
		}
		if u.Scheme != "nats" || u.User == nil {
			t.Fatalf("NATS URL %q: want nats://USER:${PASSWORD}@HOST:PORT", raw)
		}
		users, pwVars, hosts = append(users, u.User.Username()), append(pwVars, m[1]), append(hosts, u.Host)
	}
	return users, pwVars, hosts
}

// The image: a multi-stage build of the one binary, tollgate (static, CGO
// off, stripped), onto a distroless base as a non-root user, and every
// Tollgate service of compose.yaml runs it with a component.
func TestEveryTollgateServiceRunsABinaryTheImageBuilds(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var froms, users, buildLines, cmds []string
	copied := false
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		switch fields := strings.Fields(line); {
		case len(fields) == 0 || strings.HasPrefix(line, "#"):
		case fields[0] == "FROM":
			froms = append(froms, fields[1])
		case fields[0] == "USER":
			users = append(users, fields[1])
		case fields[0] == "RUN" && strings.Contains(line, "go build"):
			buildLines = append(buildLines, line)
		case fields[0] == "COPY" && slices.Equal(fields[1:], []string{"--from=build", "/out/", "/usr/local/bin/"}):
			copied = true
		case fields[0] == "ENTRYPOINT":
			t.Errorf("ENTRYPOINT %q: the image has none, each service names its binary", line)
		case fields[0] == "CMD":
			cmds = append(cmds, line)
		}
	}
	if len(froms) < 2 || !strings.HasPrefix(froms[0], "golang:1.26") {
		t.Errorf("stages %v: want a golang:1.26 builder and a final stage", froms)
	}
	if final := froms[len(froms)-1]; final != "gcr.io/distroless/static-debian12:nonroot" && final != "scratch" {
		t.Errorf("final stage FROM %s: want distroless static (nonroot) or scratch", final)
	}
	if len(users) == 0 || slices.Contains([]string{"root", "0", "0:0"}, users[len(users)-1]) {
		t.Errorf("USER %v: the image must run as a non-root user", users)
	}
	if !copied {
		t.Error("no COPY --from=build /out/ /usr/local/bin/: the binaries are not in the image's PATH")
	}
	if len(buildLines) != 1 {
		t.Fatalf("want one RUN ... go build, got %q", buildLines)
	}
	build := buildLines[0]
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w"`, "-o /out/"} {
		if !strings.Contains(build, want) {
			t.Errorf("build line %q lacks %s", build, want)
		}
	}

	// What the build line builds: ./cmd/... is every main package under
	// cmd/, ./cmd/NAME is one.
	built := map[string]bool{}
	for _, arg := range strings.Fields(build) {
		dir, ok := strings.CutPrefix(arg, "./cmd/")
		if !ok {
			continue
		}
		if dir == "..." {
			entries, err := os.ReadDir(filepath.Join(repoRoot, "cmd"))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if e.IsDir() && isMain(t, filepath.Join(repoRoot, "cmd", e.Name())) {
					built[e.Name()] = true
				}
			}
			continue
		}
		built[dir] = isMain(t, filepath.Join(repoRoot, "cmd", dir))
	}
	if !built["tollgate"] {
		t.Errorf("the image does not build tollgate, the one binary (built: %v)", built)
	}
	for _, c := range cmds {
		var args []string
		if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(c, "CMD"))), &args); err != nil || len(args) == 0 || !built[args[0]] {
			t.Errorf("%s: want the exec form naming a binary the image builds", c)
		}
	}

	services := loadCompose(t).tollgateServices()
	if len(services) == 0 {
		t.Fatal("compose.yaml runs no Tollgate service")
	}
	for name, s := range services {
		if len(s.Command) < 2 || s.Command[0] != "tollgate" || !built[s.Command[0]] {
			t.Errorf("service %s runs %q: want the one binary the image builds, tollgate, and a component", name, s.Command)
		}
	}
}

var packageMain = regexp.MustCompile(`(?m)^package main$`)

// isMain reports whether dir holds a main package.
func isMain(t *testing.T, dir string) bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if packageMain.Match(b) {
			return true
		}
	}
	return false
}

// stageFlags is the flag set a stage binary builds (stagecmd.StageFlags).
func stageFlags(stage string) flagset.Binary {
	var c scaffold.Common
	return flagset.Stage(stage, &c)
}

// helpFlags is bin's flags as its -h output shows them (flagset.Help).
func helpFlags(t *testing.T, bin string, args ...string) flagset.Binary {
	t.Helper()
	b, err := flagset.Help(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every Tollgate service's command parses with its binary's flag set (no
// unknown flag, no stray argument, values of the right type), and every
// TOLLGATE_* variable it sets is one its binary reads. The stages' flag
// sets are built as the stage binaries build them; the gateway and
// tollgate's subcommands are built and asked for their help.
func TestTollgateServicesUseOnlyFlagsAndVariablesTheirBinariesTake(t *testing.T) {
	services := loadCompose(t).tollgateServices()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := childproc.Binaries(ctx, t.TempDir(), false, []string{"tollgate"}, "./cmd/tollgate")
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range services {
		t.Run(name, func(t *testing.T) {
			b, args := s.component()
			if b == "" {
				t.Fatal("no command")
			}
			var bf flagset.Binary
			switch {
			case slices.Contains(tollgate.AllStages(), b):
				bf = stageFlags(b)
			case s.Command[0] == "tollgate":
				bf = helpFlags(t, filepath.Join(bin, "tollgate"), b)
			default:
				t.Fatalf("binary %q: no flag set known for it", b)
			}
			if err := bf.Flags.Parse(args); err != nil {
				t.Errorf("command %q: %v", s.Command, err)
			} else if bf.Flags.NArg() > 0 {
				t.Errorf("command %q: stray arguments %q", s.Command, bf.Flags.Args())
			}
			for v := range s.Environment {
				if strings.HasPrefix(v, "TOLLGATE_") && !bf.Env[v] && v != "TOLLGATE_SEAL_KEYS" {
					t.Errorf("environment %s: %s does not read it (it reads %v)", v, b, bf.Env)
				}
			}
		})
	}
	// The seal keys are read by seal.FromEnv, not a flag: the stage flag
	// set names the variable in --seal-keys' help.
	if !stageFlags(tollgate.StageIngest).Env["TOLLGATE_SEAL_KEYS"] {
		t.Error("the stages' flags no longer name TOLLGATE_SEAL_KEYS")
	}
}

// The topology is provisioned once, as admin, after the NATS nodes are
// healthy and with the replicas the stages check for; the four stages
// start after it with --no-provision, the seal keys and their own NATS
// user on all three nodes; the gateway starts after it under its user.
func TestStagesStartOnlyAfterAdminProvisionedTheTopology(t *testing.T) {
	f := loadCompose(t)
	nodes := f.natsNodes()
	if len(nodes) != 3 {
		t.Fatalf("%d NATS nodes, want 3", len(nodes))
	}
	prov, ok := f.Services["provision"]
	if !ok || len(prov.Command) < 2 || prov.Command[0] != "tollgate" || prov.Command[1] != "provision" {
		t.Fatalf("service provision runs %q, want tollgate provision", prov.Command)
	}
	for node := range nodes {
		if prov.DependsOn[node] != "service_healthy" {
			t.Errorf("provision depends on %s %q, want service_healthy", node, prov.DependsOn[node])
		}
		if nodes[node].Healthcheck == nil {
			t.Errorf("NATS node %s has no healthcheck for provision to wait on", node)
		}
	}
	provReplicas := provisionReplicas(t, prov.Command[2:], prov.Environment)
	checkLogins(t, "provision", prov, "admin", nodes)

	for name, s := range f.tollgateServices() {
		if name == "provision" {
			continue
		}
		if got := s.DependsOn["provision"]; got != "service_completed_successfully" {
			t.Errorf("%s depends on provision %q, want service_completed_successfully", name, got)
		}
		stage, args := s.component()
		if stage == "" {
			t.Errorf("%s: no command", name)
			continue
		}
		switch {
		case slices.Contains(tollgate.AllStages(), stage):
			var c scaffold.Common
			for k, v := range s.Environment {
				if !strings.Contains(v, "${") {
					t.Setenv(k, v)
				}
			}
			if err := stagecmd.StageFlags(stage, "", &c).Parse(args); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !c.NoProvision {
				t.Errorf("%s runs without --no-provision", name)
			}
			if c.Replicas != provReplicas {
				t.Errorf("%s checks for %d replicas, provision creates %d", name, c.Replicas, provReplicas)
			}
			if !strings.Contains(s.Environment["TOLLGATE_SEAL_KEYS"], "${TOLLGATE_SEAL_KEYS") {
				t.Errorf("%s: TOLLGATE_SEAL_KEYS %q, want it from the environment", name, s.Environment["TOLLGATE_SEAL_KEYS"])
			}
			checkLogins(t, name, s, stage, nodes)
		case stage == "gateway":
			checkLogins(t, name, s, "gateway", nodes)
		default:
			t.Errorf("%s runs %s: not a stage or the gateway", name, stage)
		}
	}
}

// provisionReplicas is tollgate provision's --replicas in args, else
// TOLLGATE_REPLICAS in env, else its default 1.
func provisionReplicas(t *testing.T, args []string, env map[string]string) int {
	t.Helper()
	v, ok := env["TOLLGATE_REPLICAS"]
	if i := slices.Index(args, "--replicas"); i >= 0 && i+1 < len(args) {
		v, ok = args[i+1], true
	}
	if !ok {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("provision: replicas %q: %v", v, err)
	}
	return n
}

// checkLogins checks that s connects as user to every node, on the port
// the node listens on.
func checkLogins(t *testing.T, name string, s service, user string, nodes map[string]service) {
	t.Helper()
	urls, ok := s.Environment["TOLLGATE_NATS_URL"]
	if !ok {
		t.Errorf("%s: no TOLLGATE_NATS_URL", name)
		return
	}
	users, _, hosts := natsLogins(t, urls)
	var want []string
	for node := range nodes {
		want = append(want, node+":4222")
	}
	slices.Sort(want)
	slices.Sort(hosts)
	if !slices.Equal(hosts, want) {
		t.Errorf("%s connects to %v, want all of %v", name, hosts, want)
	}
	for _, u := range users {
		if u != user {
			t.Errorf("%s logs in as %s, want %s", name, u, user)
		}
	}
}

// Each NATS node's configuration, laid out as compose mounts it and with
// the passwords compose passes it, loads in nats-server: three nodes of one
// cluster, each routing to all three, JetStream on a volume with
// sync_interval always, and every user a Tollgate service logs in as
// exists with the password variable that service interpolates.
func TestNATSNodesLoadAsOneThreeNodeClusterThatSyncsAlways(t *testing.T) {
	f := loadCompose(t)
	nodes := f.natsNodes()
	if len(nodes) != 3 {
		t.Fatalf("%d NATS nodes, want 3", len(nodes))
	}
	var nodeNames []string
	for n := range nodes {
		nodeNames = append(nodeNames, n)
	}
	slices.Sort(nodeNames)
	clusters, serverNames := map[string]bool{}, map[string]bool{}
	for _, name := range nodeNames {
		s := nodes[name]
		t.Run(name, func(t *testing.T) {
			i := slices.Index(s.Command, "--config")
			if i < 0 || i+1 >= len(s.Command) {
				t.Fatalf("command %q: no --config", s.Command)
			}
			// Each variable compose passes gets a value naming it, so that a
			// user's password shows which variable it came from.
			for k, v := range s.Environment {
				if m := interpolatedVar.FindStringSubmatch(v); m != nil && m[1] == k {
					t.Setenv(k, "pw-"+k)
				}
			}
			root := layOut(t, s)
			opts, err := server.ProcessConfigFile(filepath.Join(root, s.Command[i+1]))
			if err != nil {
				t.Fatalf("nats-server: %v", err)
			}
			if !opts.JetStream || !opts.SyncAlways {
				t.Errorf("jetstream %v, sync_interval always %v: want both", opts.JetStream, opts.SyncAlways)
			}
			if !onVolume(s, opts.StoreDir) {
				t.Errorf("store_dir %s is on no volume of %s", opts.StoreDir, name)
			}
			var routes []string
			for _, r := range opts.Routes {
				routes = append(routes, r.Host)
			}
			slices.Sort(routes)
			want := []string{nodeNames[0] + ":6222", nodeNames[1] + ":6222", nodeNames[2] + ":6222"}
			if !slices.Equal(routes, want) || opts.Cluster.Port != 6222 {
				t.Errorf("routes %v on cluster port %d, want %v on 6222", routes, opts.Cluster.Port, want)
			}
			if opts.Port != 4222 || opts.HTTPPort != 8222 {
				t.Errorf("client port %d, monitoring %d: want 4222 and 8222 (the services' URLs, the health check, the exporter)", opts.Port, opts.HTTPPort)
			}
			clusters[opts.Cluster.Name], serverNames[opts.ServerName] = true, true

			pw := map[string]string{}
			for _, u := range opts.Users {
				pw[u.Username] = u.Password
			}
			for svcName, svc := range f.tollgateServices() {
				users, vars, _ := natsLogins(t, svc.Environment["TOLLGATE_NATS_URL"])
				for j, u := range users {
					if got, ok := pw[u]; !ok {
						t.Errorf("%s logs in as %s: no such user", svcName, u)
					} else if got != "pw-"+vars[j] {
						t.Errorf("%s logs in as %s with ${%s}; the node gives %s a password from another variable", svcName, u, vars[j], u)
					}
				}
			}
		})
	}
	if len(clusters) != 1 || len(serverNames) != 3 {
		t.Errorf("cluster names %v, server names %v: want one cluster of three distinct servers", clusters, serverNames)
	}
}

// onVolume reports whether dir is at or under a named volume's mount of s.
func onVolume(s service, dir string) bool {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && !strings.HasPrefix(parts[0], ".") && !strings.HasPrefix(parts[0], "/") &&
			(dir == parts[1] || strings.HasPrefix(dir, parts[1]+"/")) {
			return true
		}
	}
	return false
}

type promConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// Prometheus loads deploy/prometheus/alerts.yml and scrapes each Tollgate
// process as the job tollgate-<service> on its --metrics port (the alerts
// take jobs named *tollgate* for Tollgate binaries), and the NATS exporter,
// which reads every node with -jsz=all. promtool, where installed, checks
// the configuration and the rules as mounted.
func TestPrometheusScrapesEveryTollgateProcessAndLoadsTheAlerts(t *testing.T) {
	f := loadCompose(t)
	prom, ok := f.Services["prometheus"]
	if !ok {
		t.Fatal("no prometheus service")
	}
	const configPath = "/etc/prometheus/prometheus.yml"
	binds := prom.binds()
	src, ok := binds[configPath]
	if !ok || !slices.Contains(prom.Command, "--config.file="+configPath) {
		t.Fatalf("prometheus: want %s mounted and passed as --config.file (binds %v, command %q)", configPath, binds, prom.Command)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var cfg promConfig
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, r := range cfg.RuleFiles {
		rules = append(rules, filepath.Clean(binds[path.Join(path.Dir(configPath), r)]))
	}
	if want := filepath.Clean("../prometheus/alerts.yml"); !slices.Contains(rules, want) {
		t.Errorf("rule files %q load %v, want %s", cfg.RuleFiles, rules, want)
	}

	jobs := map[string][]string{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			jobs[sc.JobName] = append(jobs[sc.JobName], st.Targets...)
		}
	}
	wantJobs := map[string]bool{}
	for name, s := range f.tollgateServices() {
		if name == "provision" {
			continue
		}
		i := slices.Index(s.Command, "--metrics")
		if i < 0 || i+1 >= len(s.Command) {
			t.Errorf("%s: no --metrics address (the default is loopback, which Prometheus cannot reach)", name)
			continue
		}
		_, port, _ := strings.Cut(s.Command[i+1], ":")
		job := "tollgate-" + name
		wantJobs[job] = true
		if targets := jobs[job]; !slices.Equal(targets, []string{name + ":" + port}) {
			t.Errorf("job %s scrapes %v, want [%s:%s]", job, targets, name, port)
		}
	}
	for job := range jobs {
		if strings.Contains(job, "tollgate") && !wantJobs[job] {
			t.Errorf("job %s: the alerts take it for a Tollgate binary, but no such service runs", job)
		}
	}

	exp, ok := f.Services["nats-exporter"]
	if !ok {
		t.Fatal("no nats-exporter service")
	}
	if !slices.Contains(exp.Command, "-jsz=all") {
		t.Errorf("nats-exporter %q: want -jsz=all", exp.Command)
	}
	for node := range f.natsNodes() {
		if !slices.Contains(exp.Command, "http://"+node+":8222") {
			t.Errorf("nats-exporter %q does not read %s", exp.Command, node)
		}
	}
	scraped := false
	for _, targets := range jobs {
		scraped = scraped || slices.Contains(targets, "nats-exporter:7777")
	}
	if !scraped {
		t.Error("no job scrapes nats-exporter:7777")
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found: install Debian's prometheus package")
		}
		t.Skip("promtool not found: the configuration was not checked by promtool")
	}
	root := layOut(t, prom)
	out, err := exec.Command(promtool, "check", "config", filepath.Join(root, configPath)).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "alerts.yml") {
		t.Fatalf("promtool did not check the rules:\n%s", out)
	}
}

// Grafana is provisioned with the Prometheus service as its default data
// source and with deploy/grafana/tollgate.json as a file dashboard.
func TestGrafanaIsProvisionedWithTheDashboard(t *testing.T) {
	f := loadCompose(t)
	g, ok := f.Services["grafana"]
	if !ok {
		t.Fatal("no grafana service")
	}
	binds := g.binds()
	prov, ok := binds["/etc/grafana/provisioning"]
	if !ok {
		t.Fatalf("grafana: no provisioning directory mounted (binds %v)", binds)
	}
	var ds struct {
		Datasources []struct {
			Type, URL string
			IsDefault bool `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	readYAML(t, filepath.Join(prov, "datasources", "prometheus.yml"), &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || !ds.Datasources[0].IsDefault {
		t.Fatalf("data sources %+v: want Prometheus as the default", ds.Datasources)
	}
	if u, err := url.Parse(ds.Datasources[0].URL); err != nil || u.Port() != "9090" || f.Services[u.Hostname()].Image == "" || !strings.HasPrefix(f.Services[u.Hostname()].Image, "prom/prometheus") {
		t.Errorf("data source URL %s: want the prometheus service on 9090", ds.Datasources[0].URL)
	}

	var dash struct {
		Providers []struct {
			Type    string
			Options struct{ Path string }
		} `yaml:"providers"`
	}
	readYAML(t, filepath.Join(prov, "dashboards", "tollgate.yml"), &dash)
	if len(dash.Providers) != 1 || dash.Providers[0].Type != "file" {
		t.Fatalf("dashboard providers %+v: want one file provider", dash.Providers)
	}
	dir := dash.Providers[0].Options.Path
	src, ok := binds[path.Join(dir, "tollgate.json")]
	if !ok || filepath.Clean(src) != filepath.Clean("../grafana/tollgate.json") {
		t.Fatalf("the provider reads %s, where %q is mounted as tollgate.json; want deploy/grafana/tollgate.json", dir, src)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ UID string }
	if err := json.Unmarshal(b, &d); err != nil || d.UID == "" {
		t.Fatalf("%s: not a dashboard with a uid (%v)", src, err)
	}
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// Published ports listen on the host's loopback only, every bind mount's
// source exists (the gateway's keys secret aside, which the operator
// creates), and every /run/secrets file a command reads is a secret of its
// service.
func TestPortsAreLoopbackAndMountsAndSecretsResolve(t *testing.T) {
	f := loadCompose(t)
	for name, s := range f.Services {
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s publishes %s: want 127.0.0.1:HOST:CONTAINER", name, p)
			}
		}
		for dst, src := range s.binds() {
			if _, err := os.Stat(src); err != nil {
				t.Errorf("%s mounts %s at %s: %v", name, src, dst, err)
			}
		}
		for _, arg := range s.Command {
			if secret, ok := strings.CutPrefix(arg, "/run/secrets/"); ok {
				if !slices.Contains(s.Secrets, secret) {
					t.Errorf("%s reads %s but is not given the secret %s", name, arg, secret)
				}
				if _, ok := f.Secrets[secret]; !ok {
					t.Errorf("%s: secret %s is not defined", name, secret)
				}
			}
		}
	}
}
