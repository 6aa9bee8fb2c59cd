package stagecmd_test

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/tools"
)

// A stage binary's --no-provision defaults from TOLLGATE_NO_PROVISION and
// is off without it.
func TestNoProvisionDefaultsFromTheEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want bool
	}{
		{"", nil, false},
		{"true", nil, true},
		{"true", []string{"--no-provision=false"}, false},
		{"", []string{"--no-provision"}, true},
	} {
		t.Run(fmt.Sprintf("env %q, flags %v", tc.env, tc.args), func(t *testing.T) {
			t.Setenv("TOLLGATE_NO_PROVISION", tc.env)
			var c scaffold.Common
			if err := stagecmd.StageFlags("executor", "", &c).Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if c.NoProvision != tc.want {
				t.Fatalf("NoProvision %v, want %v", c.NoProvision, tc.want)
			}
		})
	}
}

// Tool service discovery is on unless turned off; MCP servers come from a
// tools file, and a tools file that does not load stops the process.
func TestProvidersAreWhatTheFlagsAskFor(t *testing.T) {
	t.Setenv("TOLLGATE_TOOL_SERVICES", "")
	t.Setenv("TOLLGATE_TOOLS", "")
	env := jstest.Start(t)
	file := filepath.Join(t.TempDir(), "tools.json")
	if err := os.WriteFile(file, []byte(`{"mcp_servers": {"files": {"command": "sh"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string // provider names; nil with err
		err  string
	}{
		{"by default, NATS tool services", nil, []string{"nats"}, ""},
		{"discovery turned off", []string{"--tool-services=false"}, nil, ""},
		{"a tools file", []string{"--tools", file}, []string{"nats", "mcp"}, ""},
		{"a tools file without discovery", []string{"--tools", file, "--tool-services=false"}, []string{"mcp"}, ""},
		{"a tools file that is missing", []string{"--tools", file + ".missing"}, nil, "tools.json.missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c scaffold.Common
			fs := flag.NewFlagSet("p", flag.ContinueOnError)
			c.Register(fs, "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			ps, err := stagecmd.Providers(env.NC, c, pipelinetest.Logger(), nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Providers: %v, want an error naming %s", err, tc.err)
				}
				return
			}
			var names []string
			for _, p := range ps {
				names = append(names, p.Name())
			}
			if err != nil || !slices.Equal(names, tc.want) {
				t.Fatalf("Providers = %v, %v; want %v", names, err, tc.want)
			}
		})
	}
}

func TestToolsAreTheBuiltinsAndTheLedgersOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		name, ledger string
		want         []string
	}{
		{"without TOLLGATE_LEDGER", "", []string{"echo", "write_file"}},
		{"with TOLLGATE_LEDGER naming a file", filepath.Join(t.TempDir(), "ledger.jsonl"),
			append([]string{"echo", "write_file"}, tools.LedgerNames...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TOLLGATE_LEDGER", tc.ledger)
			sandbox := filepath.Join(t.TempDir(), "sandbox")
			ts, err := stagecmd.Tools(sandbox)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tool := range ts {
				names = append(names, tool.Name())
			}
			if !slices.Equal(names, tc.want) {
				t.Fatalf("tools %v, want %v", names, tc.want)
			}
			if st, err := os.Stat(sandbox); err != nil || !st.IsDir() {
				t.Fatalf("sandbox not created: %v", err)
			}
		})
	}
}

// A malformed TOLLGATE_* value is never read as the default: EnvErr names
// each variable, a boolean flag still takes no argument, and the help is
// that of a well-formed environment.
func TestMalformedEnvironmentIsRefused(t *testing.T) {
	t.Setenv("TOLLGATE_CLAIM_LEASE", "90")
	t.Setenv("TOLLGATE_NO_PROVISION", "yes")
	var c scaffold.Common
	fs := stagecmd.StageFlags("executor", "", &c)
	if err := fs.Parse([]string{"--no-provision", "--replicas", "3"}); err != nil {
		t.Fatal(err)
	}
	if !c.NoProvision || c.Replicas != 3 {
		t.Fatalf("flags after malformed defaults: %+v", c)
	}
	err := scaffold.EnvErr(fs)
	var envErr *scaffold.EnvError
	if !errors.As(err, &envErr) || !strings.Contains(err.Error(), `TOLLGATE_CLAIM_LEASE="90"`) || !strings.Contains(err.Error(), `TOLLGATE_NO_PROVISION="yes"`) {
		t.Fatalf("EnvErr = %v, want both variables named", err)
	}
	var help strings.Builder
	scaffold.PrintHelp(&help, fs, "")
	if !strings.Contains(help.String(), "-claim-lease") || !strings.Contains(help.String(), "-no-provision\n") || strings.Contains(help.String(), "panic") {
		t.Fatalf("help:\n%s", help.String())
	}
	t.Setenv("TOLLGATE_CLAIM_LEASE", "90s")
	t.Setenv("TOLLGATE_NO_PROVISION", "")
	fs = stagecmd.StageFlags("executor", "", &c)
	if err := fs.Parse(nil); err != nil || scaffold.EnvErr(fs) != nil || c.ClaimLease != 90*time.Second || c.NoProvision {
		t.Fatalf("well-formed: %v, %v, %+v", err, scaffold.EnvErr(fs), c)
	}
}
