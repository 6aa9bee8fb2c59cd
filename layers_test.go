package tollgate_test

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// layers is the map of docs/architecture.md, lowest first: a package may
// import packages of its own layer or a lower one, never a higher one. A
// package is placed by its longest matching path prefix (relative to the
// module); one no prefix names fails the test, so a new package is placed
// on purpose.
var layers = []struct {
	name     string
	prefixes []string
}{
	{"base", []string{"reveal", "tracing", "metrics", "schemas", "seal", "health", "internal/httpserve", "internal/childproc", "jetstream/embedded", "pipeline/planner/plannertest"}},
	{"protocol", []string{"jetstream/topology", "jetstream/jstest", "pipeline/bus", "pipeline/store", "tools", "policy", "audit", "transport/eventfeed", "jetstream/groupcommit"}},
	{"pipeline", []string{"pipeline"}},
	{"transport", []string{"transport"}},
	{"root", []string{".", "internal/stagecmd", "internal/flagset", "internal/gatewaycmd", "internal/chatcmd", "internal/slackcmd", "internal/discordcmd"}},
	{"harness", []string{"internal/pipelinetest", "transport/chat/chattest", "internal/chaos", "internal/bench", "internal/soak"}},
	{"program", []string{"cmd", "examples", "e2e", "deploy", "docs"}},
}

const module = "github.com/tollgate-dev/tollgate"

func layerOf(pkg string) (int, bool) {
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
	if rel == "" {
		rel = "."
	}
	best, bestLen := -1, -1
	for i, l := range layers {
		for _, p := range l.prefixes {
			if (rel == p || strings.HasPrefix(rel, p+"/")) && len(p) > bestLen {
				best, bestLen = i, len(p)
			}
		}
	}
	return best, best >= 0
}

// TestLayers fails when a package imports a higher layer than its own
// (a stage importing a transport, a tool importing the pipeline, the
// pipeline importing the composition root).
func TestLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var bad []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		from, ok := layerOf(f[0])
		if !ok {
			bad = append(bad, f[0]+": in no layer of docs/architecture.md")
			continue
		}
		for _, imp := range f[1:] {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			if to, _ := layerOf(imp); to > from {
				bad = append(bad, f[0]+" ("+layers[from].name+") imports "+imp+" ("+layers[to].name+")")
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// The gateway is an HTTP surface over the protocol: everything it links
// (go list -deps, so an indirect import counts too) is of the protocol
// layer or lower (the bus, the store, the policy with its admission rule,
// the NATS tool protocol), never a stage or a stage's helper (the runner):
// its binary would link them.
func TestGatewayDependsOnTheProtocolOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./transport/gateway").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	protocol := -1
	for i, l := range layers {
		if l.name == "protocol" {
			protocol = i
		}
	}
	for _, p := range strings.Fields(string(out)) {
		if p == module+"/transport/gateway" || (p != module && !strings.HasPrefix(p, module+"/")) {
			continue
		}
		if l, ok := layerOf(p); !ok || l > protocol {
			t.Errorf("transport/gateway links %s", strings.TrimPrefix(p, module+"/"))
		}
	}
}
