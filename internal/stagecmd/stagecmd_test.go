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
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/tools"
)

func TestFlagsDefaultFromTheEnvironment(t *testing.T) {
	t.Setenv("TOLLGATE_NATS_URL", "nats://127.0.0.1:5222")
	t.Setenv("TOLLGATE_NATS_CREDS", "/etc/tollgate/executor.creds")
	t.Setenv("TOLLGATE_METRICS_ADDR", "127.0.0.1:9999")
	t.Setenv("TOLLGATE_POLICY", "/etc/tollgate/policy.json")
	t.Setenv("TOLLGATE_SANDBOX", "/var/lib/tollgate/sandbox")
	t.Setenv("TOLLGATE_REPLICAS", "3")
	t.Setenv("TOLLGATE_LOG_LEVEL", "debug")
	t.Setenv("TOLLGATE_TOOL_SERVICES", "false")
	t.Setenv("TOLLGATE_TOOLS", "/etc/tollgate/tools.json")
	t.Setenv("TOLLGATE_INBOX_PREFIX", "_INBOX_executor")
	t.Setenv("TOLLGATE_JS_API_PREFIX", "JS.TOLLGATE.API")
	t.Setenv("TOLLGATE_RETENTION", "1440h")
	t.Setenv("TOLLGATE_GROUP_COMMIT", "false")
	var c stagecmd.Common
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := stagecmd.Common{NATSURL: "nats://127.0.0.1:5222", Creds: "/etc/tollgate/executor.creds", MetricsAddr: "127.0.0.1:9999",
		LogLevel: "debug", Replicas: 3, PolicyPath: "/etc/tollgate/policy.json", SandboxDir: "/var/lib/tollgate/sandbox",
		ToolServices: false, ToolsFile: "/etc/tollgate/tools.json", Retention: 1440 * time.Hour,
		Account: stagecmd.Account{InboxPrefix: "_INBOX_executor", APIPrefix: "JS.TOLLGATE.API"}}
	if c != want {
		t.Fatalf("from the environment: %+v, want %+v", c, want)
	}

	// A flag beats the environment.
	fs = flag.NewFlagSet("y", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse([]string{"--nats", "nats://127.0.0.1:6222", "--metrics", "", "--tool-services", "--tools", "", "--group-commit"}); err != nil {
		t.Fatal(err)
	}
	if c.NATSURL != "nats://127.0.0.1:6222" || c.MetricsAddr != "" || !c.ToolServices || c.ToolsFile != "" || !c.GroupCommit {
		t.Fatalf("flags did not override the environment: %+v", c)
	}
}

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
			var c stagecmd.Common
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
			var c stagecmd.Common
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

// Account.Connect gives the connection its account's inbox prefix and the
// JetStream handle its API prefix; the zero Account keeps nats.go's
// defaults, and so do the flags' defaults.
func TestAccountConnectUsesItsPrefixes(t *testing.T) {
	env := jstest.Start(t)
	for _, tc := range []struct {
		name       string
		account    stagecmd.Account
		inbox, api string
	}{
		{"zero", stagecmd.Account{}, "_INBOX.", ""},
		{"the flags' defaults", stagecmd.Account{InboxPrefix: "_INBOX", APIPrefix: "$JS.API"}, "_INBOX.", "$JS.API"},
		{"in an account of its own", stagecmd.Account{InboxPrefix: "_INBOX_executor", APIPrefix: "JS.TOLLGATE.API"},
			"_INBOX_executor.", "JS.TOLLGATE.API"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, js, err := tc.account.Connect(env.Server.ClientURL(), "", "stagecmd-test", pipelinetest.Logger())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if got := nc.NewInbox(); !strings.HasPrefix(got, tc.inbox) || strings.Count(got, ".") != 1 {
				t.Errorf("inbox %s, want one under %s", got, tc.inbox)
			}
			if got := js.Options().APIPrefix; got != tc.api {
				t.Errorf("API prefix %q, want %q", got, tc.api)
			}
		})
	}
}

// --group-commit is off unless TOLLGATE_GROUP_COMMIT or the flag turns
// it on.
func TestGroupCommitIsOffByDefault(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want bool
	}{
		{"", nil, false},
		{"true", nil, true},
		{"false", []string{"--group-commit"}, true},
		{"true", []string{"--group-commit=false"}, false},
	} {
		t.Setenv("TOLLGATE_GROUP_COMMIT", tc.env)
		var c stagecmd.Common
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		c.Register(fs, "127.0.0.1:1")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if c.GroupCommit != tc.want {
			t.Errorf("env %q, flags %v: group commit %v, want %v", tc.env, tc.args, c.GroupCommit, tc.want)
		}
	}
}

// A malformed TOLLGATE_* value is never read as the default: EnvErr names
// each variable, a boolean flag still takes no argument, and the help is
// that of a well-formed environment.
func TestMalformedEnvironmentIsRefused(t *testing.T) {
	t.Setenv("TOLLGATE_CLAIM_LEASE", "90")
	t.Setenv("TOLLGATE_NO_PROVISION", "yes")
	var c stagecmd.Common
	fs := stagecmd.StageFlags("executor", "", &c)
	if err := fs.Parse([]string{"--no-provision", "--replicas", "3"}); err != nil {
		t.Fatal(err)
	}
	if !c.NoProvision || c.Replicas != 3 {
		t.Fatalf("flags after malformed defaults: %+v", c)
	}
	err := stagecmd.EnvErr(fs)
	var envErr *stagecmd.EnvError
	if !errors.As(err, &envErr) || !strings.Contains(err.Error(), `TOLLGATE_CLAIM_LEASE="90"`) || !strings.Contains(err.Error(), `TOLLGATE_NO_PROVISION="yes"`) {
		t.Fatalf("EnvErr = %v, want both variables named", err)
	}
	var help strings.Builder
	stagecmd.PrintHelp(&help, fs, "")
	if !strings.Contains(help.String(), "-claim-lease") || !strings.Contains(help.String(), "-no-provision\n") || strings.Contains(help.String(), "panic") {
		t.Fatalf("help:\n%s", help.String())
	}
	t.Setenv("TOLLGATE_CLAIM_LEASE", "90s")
	t.Setenv("TOLLGATE_NO_PROVISION", "")
	fs = stagecmd.StageFlags("executor", "", &c)
	if err := fs.Parse(nil); err != nil || stagecmd.EnvErr(fs) != nil || c.ClaimLease != 90*time.Second || c.NoProvision {
		t.Fatalf("well-formed: %v, %v, %+v", err, stagecmd.EnvErr(fs), c)
	}
}
