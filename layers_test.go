package tollgate_test

import (
	"os/exec"
	"slices"
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
	{"protocol", []string{"jetstream/topology", "jetstream/jstest", "pipeline/bus", "pipeline/submit", "pipeline/store", "tools", "policy", "audit", "transport/eventfeed", "jetstream/turnlog", "jetstream/turnorder"}},
	{"pipeline", []string{"pipeline"}},
	{"transport", []string{"transport"}},
	{"root", []string{".", "internal/scaffold", "internal/stagecmd", "internal/flagset", "internal/gatewaycmd", "internal/chatcmd", "internal/slackcmd", "internal/discordcmd"}},
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

// stagePackages are the pipeline's stages and what only stages use (the
// batch runner's, the planner's model client): a binary that runs no stage
// must not link them.
var stagePackages = []string{"pipeline/ingest", "pipeline/executor", "pipeline/approver", "pipeline/redriver", "pipeline/planner", "pipeline/batch"}

// The gateway and the chat transports run no stage: their binaries link
// neither the composition root (package tollgate, which links every
// stage), nor a stage package, nor the planner's model client
// (github.com/openai/openai-go), only the process scaffold
// (internal/scaffold) of the stage binaries' code (internal/stagecmd).
// The web inbox decides who may decide or revoke with the decider rule's
// one home, policy.Policy.MayDecideApproval and MayRevokeGrant, which the
// approver applies too, so it links no stage for it.
func TestGatewayAndChatBinariesDependOnNoStage(t *testing.T) {
	for _, tc := range []struct {
		cmd     string
		allowed []string // stage packages it may link, relative to the module
	}{
		{"./cmd/gateway", nil},
		{"./cmd/slack", nil},
		{"./cmd/discord", nil},
	} {
		out, err := exec.Command("go", "list", "-deps", tc.cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", tc.cmd, err)
		}
		var bad []string
		for _, p := range strings.Fields(string(out)) {
			if isStage, why := stageDep(p); isStage && !slices.Contains(tc.allowed, strings.TrimPrefix(p, module+"/")) {
				bad = append(bad, p+" ("+why+")")
			}
		}
		if len(bad) > 0 {
			t.Errorf("%s links %d packages of the stages:\n  %s", tc.cmd, len(bad), strings.Join(bad, "\n  "))
		}
	}
}

// stageDep reports whether the package p is one a binary that runs no
// stage must not link, and why.
func stageDep(p string) (bool, string) {
	if p == module {
		return true, "the composition root"
	}
	if p == "github.com/openai/openai-go" || strings.HasPrefix(p, "github.com/openai/openai-go/") {
		return true, "the planner's model client"
	}
	for _, s := range stagePackages {
		if p == module+"/"+s || strings.HasPrefix(p, module+"/"+s+"/") {
			return true, "a stage"
		}
	}
	return false, ""
}

// The process scaffold every binary shares (internal/scaffold) links
// neither the composition root, nor the pipeline, nor the tools (go list
// -deps: an indirect import counts too): running a stage and offering tools
// is internal/stagecmd's.
func TestScaffoldDependsOnNoStageNorTool(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./internal/scaffold").Output()
	if err != nil {
		t.Fatalf("go list -deps ./internal/scaffold: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(p, module+"/")
		if p == module || rel == "pipeline" || strings.HasPrefix(rel, "pipeline/") || rel == "tools" || strings.HasPrefix(rel, "tools/") {
			t.Errorf("internal/scaffold links %s", p)
		}
		if bad, why := stageDep(p); bad && p != module {
			t.Errorf("internal/scaffold links %s (%s)", p, why)
		}
	}
}
