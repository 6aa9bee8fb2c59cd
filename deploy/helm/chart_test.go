// Package helm checks the Helm chart deploy/helm/tollgate without a
// cluster: it renders the chart with the Helm SDK for the default values
// and for values-production.yaml and checks the manifests. Every
// container's flags and TOLLGATE_* variables are ones its binary takes,
// the probes point at the port the process serves /healthz and /readyz
// on, every stage runs with --no-provision after the provisioning hook
// Job, the NATS credentials and seal keys come from the Secrets the values
// name, KEDA scales each stage on its own consumer and never the approver
// or the redriver to zero, and the PodMonitor exists only when enabled.
//
// It is a module of its own so that Helm's and Kubernetes' dependencies
// stay out of the product's go.mod.
package helm

import (
	"context"
	"fmt"
	"net"
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

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-dev/tollgate"
	"github.com/tollgate-dev/tollgate/internal/childproc"
	"github.com/tollgate-dev/tollgate/internal/flagset"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

const (
	chartDir = "tollgate"
	repoRoot = "../.."
	release  = "tg"
)

// valueSets are the values files the chart ships: the defaults alone,
// and values-production.yaml over them.
var valueSets = []struct{ name, file string }{
	{"default values", ""},
	{"production values", filepath.Join(chartDir, "values-production.yaml")},
}

// manifests is one rendering of the chart, by kind.
type manifests struct {
	values        chartutil.Values // the coalesced values the chart saw
	deployments   map[string]appsv1.Deployment
	jobs          []batchv1.Job
	podMonitors   []podMonitor
	scaledObjects map[string]scaledObject // by scaleTargetRef name
}

type podMonitor struct {
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port string `json:"port"`
			Path string `json:"path"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type scaledObject struct {
	Spec struct {
		ScaleTargetRef struct {
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int `json:"minReplicaCount"`
		MaxReplicaCount *int `json:"maxReplicaCount"`
		Triggers        []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// userValues reads file (none when empty) and sets each of overrides
// ("a.b.c" to a value) on top.
func userValues(t *testing.T, file string, overrides map[string]any) map[string]any {
	t.Helper()
	vals := map[string]any{}
	if file != "" {
		v, err := chartutil.ReadValuesFile(file)
		if err != nil {
			t.Fatal(err)
		}
		vals = v
	}
	for k, v := range overrides {
		m := vals
		keys := strings.Split(k, ".")
		for _, p := range keys[:len(keys)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[keys[len(keys)-1]] = v
	}
	return vals
}

// render renders the chart for release tg with file's values and
// overrides, as `helm install --dry-run` would, and parses the manifests.
func render(t *testing.T, file string, overrides map[string]any) manifests {
	t.Helper()
	ch := loadChart(t)
	vals, err := chartutil.ToRenderValues(ch, userValues(t, file, overrides),
		chartutil.ReleaseOptions{Name: release, Namespace: "tollgate", IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Engine{Strict: true}.Render(ch, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	coalesced, err := vals.Table("Values")
	if err != nil {
		t.Fatal(err)
	}
	m := manifests{values: coalesced, deployments: map[string]appsv1.Deployment{}, scaledObjects: map[string]scaledObject{}}
	for name, text := range out {
		if path.Ext(name) != ".yaml" {
			continue // NOTES.txt, _helpers.tpl
		}
		for _, doc := range releaseutil.SplitManifests(text) {
			var head struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			switch head.APIVersion + " " + head.Kind {
			case "apps/v1 Deployment":
				var d appsv1.Deployment
				decode(t, name, doc, &d)
				m.deployments[d.Spec.Template.Labels["app.kubernetes.io/component"]] = d
			case "batch/v1 Job":
				var j batchv1.Job
				decode(t, name, doc, &j)
				m.jobs = append(m.jobs, j)
			case "monitoring.coreos.com/v1 PodMonitor":
				var p podMonitor
				decodePartial(t, name, doc, &p)
				m.podMonitors = append(m.podMonitors, p)
			case "keda.sh/v1alpha1 ScaledObject":
				var s scaledObject
				decodePartial(t, name, doc, &s)
				m.scaledObjects[s.Spec.ScaleTargetRef.Name] = s
			case "v1 Service":
			default:
				t.Errorf("%s: unexpected %s %s", name, head.APIVersion, head.Kind)
			}
		}
	}
	return m
}

// decode decodes doc strictly: a field Kubernetes does not know fails.
func decode(t *testing.T, name, doc string, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, doc)
	}
}

// decodePartial decodes doc into v, which holds only the fields checked
// (a custom resource, for which no Go type is at hand).
func decodePartial(t *testing.T, name, doc string, v any) {
	t.Helper()
	if err := yaml.Unmarshal([]byte(doc), v); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, doc)
	}
}

// value is the coalesced value at a dotted path.
func (m manifests) value(t *testing.T, p string) any {
	t.Helper()
	v, err := m.values.PathValue(p)
	if err != nil {
		t.Fatalf("values %s: %v", p, err)
	}
	return v
}

func (m manifests) str(t *testing.T, p string) string {
	t.Helper()
	s, ok := m.value(t, p).(string)
	if !ok {
		t.Fatalf("values %s: not a string", p)
	}
	return s
}

// stageFlags is the flag set a stage binary builds, filling c.
func stageFlags(stage string, c *scaffold.Common) flagset.Binary { return flagset.Stage(stage, c) }

// buildBinaries is the directory of the tollgate binary (package main, so
// not importable): make test's, else built from the repository into a
// temporary directory.
func buildBinaries(t *testing.T) string {
	t.Helper()
	if pre := os.Getenv(childproc.EnvBin); pre != "" {
		if _, err := os.Stat(filepath.Join(pre, "tollgate")); err == nil {
			return pre
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator), "./cmd/tollgate")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// componentOf is the component a container runs with the one binary
// (command tollgate, the component's name first in args), and the
// container with the rest of its arguments.
func componentOf(t *testing.T, c corev1.Container) (string, corev1.Container) {
	t.Helper()
	if !slices.Equal(c.Command, []string{"tollgate"}) || len(c.Args) == 0 {
		t.Fatalf("%s runs %q %q, want tollgate and a component", c.Name, c.Command, c.Args)
	}
	name := c.Args[0]
	c.Args = c.Args[1:]
	return name, c
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

// parseContainer parses c's args with bf's flag set, after setting c's
// literal environment (so that TOLLGATE_* defaults apply as in the pod),
// and checks that every TOLLGATE_* variable c sets is one bf reads.
func parseContainer(t *testing.T, c corev1.Container, bf func() flagset.Binary) flagset.Binary {
	t.Helper()
	for _, e := range c.Env {
		if e.ValueFrom == nil && !strings.Contains(e.Value, "$(") {
			t.Setenv(e.Name, e.Value)
		}
	}
	f := bf()
	if err := f.Flags.Parse(c.Args); err != nil {
		t.Errorf("%s %q: %v", c.Command, c.Args, err)
	} else if f.Flags.NArg() > 0 {
		t.Errorf("%s %q: stray arguments %q", c.Command, c.Args, f.Flags.Args())
	}
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "TOLLGATE_") && !f.Env[e.Name] {
			t.Errorf("%s: environment %s is not read by %s (it reads %v)", c.Name, e.Name, c.Command, f.Env)
		}
	}
	return f
}

// Every container runs the image's one binary, tollgate, with a component
// or a command first in its arguments; the rest of its arguments
// and TOLLGATE_* variables parse with that binary's flag set (no unknown
// flag, no stray argument, values of the right type): the stages' flag
// sets built as the stage binaries build them, the gateway's and
// `tollgate provision`'s from the help of the built binaries.
func TestEveryContainerUsesOnlyFlagsAndVariablesItsBinaryTakes(t *testing.T) {
	bin := buildBinaries(t)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			m := render(t, vs.file, nil)
			for deployment, d := range m.deployments {
				c := onlyContainer(t, d.Spec.Template.Spec)
				t.Run(deployment, func(t *testing.T) {
					b, c := componentOf(t, c)
					switch {
					case slices.Contains(tollgate.AllStages(), b):
						parseContainer(t, c, func() flagset.Binary { var common scaffold.Common; return stageFlags(b, &common) })
					case b == "gateway":
						parseContainer(t, c, func() flagset.Binary { return helpFlags(t, filepath.Join(bin, "tollgate"), "gateway") })
					default:
						t.Fatalf("command %q: not a stage or the gateway", b)
					}
				})
			}
			for _, j := range m.jobs {
				c := onlyContainer(t, j.Spec.Template.Spec)
				if !slices.Equal(c.Command, []string{"tollgate"}) || len(c.Args) == 0 {
					t.Fatalf("job %s runs %q %q, want tollgate and a subcommand", j.Name, c.Command, c.Args)
				}
				sub := c.Args[0]
				c.Args = c.Args[1:]
				parseContainer(t, c, func() flagset.Binary { return helpFlags(t, filepath.Join(bin, "tollgate"), sub) })
			}
		})
	}
	// The seal keys are read by seal.FromEnv, not a flag: the stage flag
	// set names the variable in --seal-keys' help.
	var c scaffold.Common
	if !stageFlags(tollgate.StageIngest, &c).Env["TOLLGATE_SEAL_KEYS"] {
		t.Error("the stages' flags no longer name TOLLGATE_SEAL_KEYS")
	}
}

func onlyContainer(t *testing.T, pod corev1.PodSpec) corev1.Container {
	t.Helper()
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	return pod.Containers[0]
}

// arg is the value of flag name in args (--name value or --name=value)
// and whether it is there. The flag sets are checked by
// TestEveryContainerUsesOnlyFlagsAndVariablesItsBinaryTakes.
func arg(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// metricsPort is the port of a --metrics address (host:port) and whether
// its host listens beyond the loopback (empty or a non-loopback address).
func metricsPort(t *testing.T, addr string) (int, bool) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--metrics %q: %v", addr, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("--metrics %q: %v", addr, err)
	}
	ip := net.ParseIP(host)
	return n, host == "" || (ip != nil && !ip.IsLoopback())
}

// containerPort resolves a probe's port (a name or a number) in c.
func containerPort(c corev1.Container, p corev1.HTTPGetAction) int {
	if p.Port.StrVal == "" {
		return p.Port.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.Port.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return -1
}

// Every stage and the gateway probe liveness on /healthz and readiness on
// /readyz at the port the process serves them on (its --metrics address,
// which listens beyond the loopback), and expose that port as "metrics".
func TestProbesPointAtTheMetricsPortTheProcessServes(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			m := render(t, vs.file, nil)
			for component, d := range m.deployments {
				c := onlyContainer(t, d.Spec.Template.Spec)
				addr, ok := arg(c.Args, "metrics")
				if !ok {
					t.Fatalf("%s: args %q: no --metrics", component, c.Args)
				}
				port, reachable := metricsPort(t, addr)
				if !reachable {
					t.Errorf("%s: --metrics %s listens on the loopback: the kubelet cannot probe it", component, addr)
				}
				for _, p := range []struct {
					name  string
					probe *corev1.Probe
					path  string
				}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
					if p.probe == nil || p.probe.HTTPGet == nil {
						t.Errorf("%s: no HTTP %s probe", component, p.name)
						continue
					}
					if got := p.probe.HTTPGet.Path; got != p.path {
						t.Errorf("%s: %s probe on %s, want %s", component, p.name, got, p.path)
					}
					if got := containerPort(c, *p.probe.HTTPGet); got != port {
						t.Errorf("%s: %s probe on port %d, the process serves it on %d", component, p.name, got, port)
					}
				}
				if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == "metrics" && int(cp.ContainerPort) == port }) {
					t.Errorf("%s: no container port metrics = %d (the PodMonitor scrapes it)", component, port)
				}
			}
		})
	}
}

// The chart deploys one Deployment per stage and one for the gateway, the
// stages with --no-provision and the same --replicas the provisioning Job
// creates; the Job runs `tollgate provision` as a pre-install and
// pre-upgrade hook, so the stages start only once it succeeded.
func TestStagesRunWithNoProvisionAfterTheProvisioningHook(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			m := render(t, vs.file, nil)
			var components []string
			for c := range m.deployments {
				components = append(components, c)
			}
			slices.Sort(components)
			want := append(slices.Clone(tollgate.AllStages()), "gateway")
			slices.Sort(want)
			if !slices.Equal(components, want) {
				t.Fatalf("deployments %v, want %v", components, want)
			}
			if len(m.jobs) != 1 {
				t.Fatalf("%d jobs, want the provisioning Job", len(m.jobs))
			}
			job := m.jobs[0]
			hooks := strings.Split(job.Annotations["helm.sh/hook"], ",")
			if !slices.Contains(hooks, "pre-install") || !slices.Contains(hooks, "pre-upgrade") {
				t.Errorf("job %s: helm.sh/hook %q, want pre-install and pre-upgrade", job.Name, job.Annotations["helm.sh/hook"])
			}
			if !strings.Contains(job.Annotations["helm.sh/hook-delete-policy"], "before-hook-creation") {
				t.Errorf("job %s: an upgrade could not create it again (hook-delete-policy %q)", job.Name, job.Annotations["helm.sh/hook-delete-policy"])
			}
			pc := onlyContainer(t, job.Spec.Template.Spec)
			if !slices.Equal(pc.Command, []string{"tollgate"}) || len(pc.Args) == 0 || pc.Args[0] != "provision" {
				t.Fatalf("job runs %q %q, want tollgate provision", pc.Command, pc.Args)
			}
			provReplicas := 1 // tollgate provision's default
			if v, ok := arg(pc.Args, "replicas"); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("provision --replicas %q: %v", v, err)
				}
				provReplicas = n
			}
			checkNATSLogin(t, m, "provision", job.Spec.Template.Spec, pc, "admin")

			for _, stage := range tollgate.AllStages() {
				d := m.deployments[stage]
				name, c := componentOf(t, onlyContainer(t, d.Spec.Template.Spec))
				if name != stage {
					t.Errorf("deployment %s runs tollgate %s", stage, name)
				}
				var common scaffold.Common
				parseContainer(t, c, func() flagset.Binary { return stageFlags(stage, &common) })
				if !common.NoProvision {
					t.Errorf("%s runs without --no-provision", stage)
				}
				if common.Replicas != provReplicas {
					t.Errorf("%s checks for %d replicas, the provisioning Job creates %d", stage, common.Replicas, provReplicas)
				}
				if want := fmt.Sprint(m.value(t, "topology.replicas")); strconv.Itoa(common.Replicas) != want {
					t.Errorf("%s: --replicas %d, topology.replicas %s", stage, common.Replicas, want)
				}
			}
		})
	}
}

// natsUsers are the users of deploy/nats/least-privilege.conf.
func natsUsers(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "nats", "least-privilege.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, m := range regexp.MustCompile(`(?m)^\s*user:\s*(\w+)`).FindAllStringSubmatch(string(b), -1) {
		users = append(users, m[1])
	}
	return users
}

// env is c's variable name, and whether c sets it.
func env(c corev1.Container, name string) (corev1.EnvVar, bool) {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return corev1.EnvVar{}, false
	}
	return c.Env[i], true
}

// secretRef checks that variable name of c comes from key of Secret
// secret, and has no literal value.
func secretRef(t *testing.T, who string, c corev1.Container, name, secret, key string) {
	t.Helper()
	e, ok := env(c, name)
	switch {
	case !ok:
		t.Errorf("%s: no %s", who, name)
	case e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil:
		t.Errorf("%s: %s is not taken from a Secret", who, name)
	case e.ValueFrom.SecretKeyRef.Name != secret || e.ValueFrom.SecretKeyRef.Key != key:
		t.Errorf("%s: %s from Secret %s key %s, want %s key %s (the values)", who, name,
			e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key, secret, key)
	}
}

// mountedSecret is the Secret and key the file at p in c comes from: the
// Secret volume mounted at p's directory, and the item whose path is p's
// name (or p's name itself when the volume lists no items).
func mountedSecret(pod corev1.PodSpec, c corev1.Container, p string) (secret, key string, ok bool) {
	dir, file := path.Split(p)
	for _, vm := range c.VolumeMounts {
		if path.Clean(vm.MountPath) != path.Clean(dir) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			if len(v.Secret.Items) == 0 {
				return v.Secret.SecretName, file, true
			}
			for _, it := range v.Secret.Items {
				if it.Path == file {
					return v.Secret.SecretName, it.Key, true
				}
			}
		}
	}
	return "", "", false
}

// checkNATSLogin checks that c logs in to every server of nats.servers as
// user, a user of least-privilege.conf, with the credentials the values
// name: the password from nats.auth.secretName (expanded into the URL by
// Kubernetes, never written in it) or the creds file mounted from it.
func checkNATSLogin(t *testing.T, m manifests, who string, pod corev1.PodSpec, c corev1.Container, user string) {
	t.Helper()
	if !slices.Contains(natsUsers(t), user) {
		t.Errorf("%s logs in as %s: no such user in deploy/nats/least-privilege.conf", who, user)
	}
	mode, secret := m.str(t, "nats.auth.mode"), m.str(t, "nats.auth.secretName")
	key := m.str(t, "nats.auth.keys."+user)
	e, ok := env(c, "TOLLGATE_NATS_URL")
	if !ok {
		t.Fatalf("%s: no TOLLGATE_NATS_URL", who)
	}
	var hosts []string
	for _, raw := range strings.Split(e.Value, ",") {
		u, err := url.Parse(strings.ReplaceAll(raw, "$(NATS_PASSWORD)", "PASSWORD"))
		if err != nil || u.Scheme != "nats" {
			t.Fatalf("%s: NATS URL %q: want nats://... (%v)", who, raw, err)
		}
		hosts = append(hosts, u.Host)
		pw, hasPW := u.User.Password()
		switch {
		case mode == "password" && (u.User.Username() != user || pw != "PASSWORD"):
			t.Errorf("%s: NATS URL %q, want nats://%s:$(NATS_PASSWORD)@...", who, raw, user)
		case mode != "password" && (u.User != nil || hasPW):
			t.Errorf("%s: NATS URL %q holds credentials in mode %s", who, raw, mode)
		}
	}
	var servers []string
	for _, s := range m.value(t, "nats.servers").([]any) {
		servers = append(servers, s.(string))
	}
	if !slices.Equal(hosts, servers) {
		t.Errorf("%s connects to %v, want nats.servers %v", who, hosts, servers)
	}
	checkAccount(t, m, who, c, user)
	switch mode {
	case "password":
		// Kubernetes expands $(NATS_PASSWORD) only from a variable set before.
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NATS_PASSWORD" })
		j := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "TOLLGATE_NATS_URL" })
		if i < 0 || i > j {
			t.Errorf("%s: NATS_PASSWORD is not set before TOLLGATE_NATS_URL expands it", who)
		}
		secretRef(t, who, c, "NATS_PASSWORD", secret, key)
	case "creds":
		creds, ok := env(c, "TOLLGATE_NATS_CREDS")
		if !ok {
			t.Fatalf("%s: no TOLLGATE_NATS_CREDS in mode creds", who)
		}
		gotSecret, gotKey, ok := mountedSecret(pod, c, creds.Value)
		if !ok || gotSecret != secret || gotKey != key {
			t.Errorf("%s: creds file %s mounted from Secret %q key %q, want %s key %s (the values)", who, creds.Value, gotSecret, gotKey, secret, key)
		}
	default:
		t.Fatalf("nats.auth.mode %q", mode)
	}
}

// checkAccount checks that c, logging in as user, reaches the bus as
// least-privilege.conf's account for user expects: with nats.ownAccounts,
// a stage or the gateway has its replies under _INBOX_<user> and the
// JetStream API under nats.jsAPIPrefix, both of which the configuration
// grants; admin lives in the account holding the streams.
func checkAccount(t *testing.T, m manifests, who string, c corev1.Container, user string) {
	t.Helper()
	conf, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "nats", "least-privilege.conf"))
	if err != nil {
		t.Fatal(err)
	}
	inbox, hasInbox := env(c, "TOLLGATE_INBOX_PREFIX")
	api, hasAPI := env(c, "TOLLGATE_JS_API_PREFIX")
	if user == "admin" || m.value(t, "nats.ownAccounts") != true {
		if hasInbox || hasAPI {
			t.Errorf("%s: inbox prefix %q, API prefix %q: want neither in the streams' account", who, inbox.Value, api.Value)
		}
		return
	}
	if want := "_INBOX_" + user; inbox.Value != want {
		t.Errorf("%s: TOLLGATE_INBOX_PREFIX %q, want %s", who, inbox.Value, want)
	}
	if want := m.str(t, "nats.jsAPIPrefix"); api.Value != want {
		t.Errorf("%s: TOLLGATE_JS_API_PREFIX %q, want %s", who, api.Value, want)
	}
	for _, p := range []string{inbox.Value, api.Value} {
		if !strings.Contains(string(conf), p+".") {
			t.Errorf("%s: %s is granted nowhere in deploy/nats/least-privilege.conf", who, p)
		}
	}
}

// Every process's secrets come from the Secrets and keys the values name,
// never inline: each logs in as its own NATS user (the stages as the
// stage, the gateway as gateway, the Job as admin); the stages get the
// seal keys in TOLLGATE_SEAL_KEYS from seal.secretName; the gateway's
// --keys file is mounted from gateway.keys.secretName.
func TestSecretsComeFromTheSecretsTheValuesName(t *testing.T) {
	sets := append(slices.Clone(valueSets), struct{ name, file string }{"creds files with the default values", ""})
	for i, vs := range sets {
		t.Run(vs.name, func(t *testing.T) {
			var overrides map[string]any
			if i == len(sets)-1 {
				overrides = map[string]any{"nats.auth.mode": "creds", "nats.auth.keys.approver": "approver.creds"}
			}
			m := render(t, vs.file, overrides)
			for component, d := range m.deployments {
				pod := d.Spec.Template.Spec
				c := onlyContainer(t, pod)
				checkNATSLogin(t, m, component, pod, c, component)
				if component == "gateway" {
					keys, ok := arg(c.Args, "keys")
					if !ok {
						t.Fatalf("gateway %q: no --keys", c.Args)
					}
					secret, key, ok := mountedSecret(pod, c, keys)
					if want, wantKey := m.str(t, "gateway.keys.secretName"), m.str(t, "gateway.keys.key"); !ok || secret != want || key != wantKey {
						t.Errorf("gateway: --keys %s mounted from Secret %q key %q, want %s key %s", keys, secret, key, want, wantKey)
					}
					continue
				}
				secretRef(t, component, c, "TOLLGATE_SEAL_KEYS", m.str(t, "seal.secretName"), m.str(t, "seal.key"))
			}
		})
	}
}

// With KEDA on (production), each stage has a ScaledObject on its
// Deployment with the nats-jetstream scaler on the stage's own durable
// consumer (jetstream/topology), and its Deployment leaves the replicas
// to KEDA. The approver and the redriver never scale to zero, whatever
// minReplicaCount says, while the other stages may.
func TestKEDAScalesEachStageOnItsConsumerAndNeverTheSweepersToZero(t *testing.T) {
	consumers := map[string]topology.ConsumerSpec{
		tollgate.StageIngest:   topology.IngestConsumer(),
		tollgate.StageExecutor: topology.ExecutorConsumer(),
		tollgate.StageApprover: topology.ApproverConsumer(),
		tollgate.StageRedriver: topology.RedriverConsumer(),
	}
	if off := render(t, "", nil); len(off.scaledObjects) != 0 {
		t.Errorf("KEDA off by default, yet %d ScaledObjects", len(off.scaledObjects))
	}
	m := render(t, valueSets[1].file, nil)
	if len(m.scaledObjects) != len(tollgate.AllStages()) {
		t.Errorf("%d ScaledObjects, want one per stage", len(m.scaledObjects))
	}
	for _, stage := range tollgate.AllStages() {
		d := m.deployments[stage]
		so, ok := m.scaledObjects[d.Name]
		if !ok {
			t.Errorf("%s: no ScaledObject targets Deployment %s", stage, d.Name)
			continue
		}
		if d.Spec.Replicas != nil {
			t.Errorf("%s: the Deployment sets %d replicas, which fights KEDA", stage, *d.Spec.Replicas)
		}
		if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "nats-jetstream" {
			t.Fatalf("%s: triggers %+v, want one nats-jetstream", stage, so.Spec.Triggers)
		}
		md := so.Spec.Triggers[0].Metadata
		if want := consumers[stage]; md["stream"] != want.Stream || md["consumer"] != want.Config.Durable {
			t.Errorf("%s scales on %s/%s, its consumer is %s/%s", stage, md["stream"], md["consumer"], want.Stream, want.Config.Durable)
		}
		if md["account"] != "TOLLGATE" || md["natsServerMonitoringEndpoint"] == "" || md["lagThreshold"] == "" {
			t.Errorf("%s: trigger metadata %v: want account TOLLGATE, a monitoring endpoint and a lag threshold", stage, md)
		}
	}

	zero := map[string]any{}
	for _, stage := range tollgate.AllStages() {
		zero["keda.stages."+stage+".minReplicaCount"] = 0
	}
	m = render(t, valueSets[1].file, zero)
	for _, stage := range tollgate.AllStages() {
		so := m.scaledObjects[m.deployments[stage].Name]
		sweeps := stage == tollgate.StageApprover || stage == tollgate.StageRedriver
		switch min := so.Spec.MinReplicaCount; {
		case min == nil:
			t.Errorf("%s: no minReplicaCount (KEDA's default is 0)", stage)
		case sweeps && *min < 1:
			t.Errorf("%s: minReplicaCount %d: it runs a sweep and must never scale to zero", stage, *min)
		case !sweeps && *min != 0:
			t.Errorf("%s: minReplicaCount %d, want the 0 asked for", stage, *min)
		}
	}
}

// The PodMonitor exists only when enabled; it then scrapes the named
// metrics port of every Deployment's pods, which its selector matches.
func TestPodMonitorOnlyWhenEnabledAndItSelectsEveryPod(t *testing.T) {
	for _, tc := range []struct {
		name      string
		file      string
		overrides map[string]any
		want      bool
	}{
		{"off by default", "", nil, false},
		{"on in production", valueSets[1].file, nil, true},
		{"off in production when disabled", valueSets[1].file, map[string]any{"podMonitor.enabled": false}, false},
		{"on with the default values when enabled", "", map[string]any{"podMonitor.enabled": true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, tc.file, tc.overrides)
			if got := len(m.podMonitors); got != map[bool]int{false: 0, true: 1}[tc.want] {
				t.Fatalf("%d PodMonitors, want enabled = %v", got, tc.want)
			}
			if !tc.want {
				return
			}
			pm := m.podMonitors[0]
			if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port != "metrics" || pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" {
				t.Errorf("endpoints %+v, want port metrics, path /metrics", pm.Spec.PodMetricsEndpoints)
			}
			sel := pm.Spec.Selector.MatchLabels
			if len(sel) == 0 {
				t.Fatal("the PodMonitor selects every pod of the namespace")
			}
			for component, d := range m.deployments {
				for k, v := range sel {
					if d.Spec.Template.Labels[k] != v {
						t.Errorf("%s: pod labels %v do not match the selector %v", component, d.Spec.Template.Labels, sel)
						break
					}
				}
			}
		})
	}
}

// `helm lint` (the SDK's linter, which action.Lint runs; called directly
// so that the test does not compile Helm's Kubernetes client) finds
// nothing to warn about in the chart with either values file.
func TestChartLints(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			res := lint.All(chartDir, userValues(t, vs.file, nil), "tollgate", false)
			for _, msg := range res.Messages {
				if msg.Severity >= support.WarningSev {
					t.Errorf("lint: %s", msg)
				}
			}
		})
	}
}
