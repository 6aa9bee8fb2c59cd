package stagecmd_test

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/stagecmd"
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
	var c stagecmd.Common
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := stagecmd.Common{NATSURL: "nats://127.0.0.1:5222", Creds: "/etc/tollgate/executor.creds", MetricsAddr: "127.0.0.1:9999",
		LogLevel: "debug", Replicas: 3, PolicyPath: "/etc/tollgate/policy.json", SandboxDir: "/var/lib/tollgate/sandbox"}
	if c != want {
		t.Fatalf("from the environment: %+v, want %+v", c, want)
	}

	// A flag beats the environment.
	fs = flag.NewFlagSet("y", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse([]string{"--nats", "nats://127.0.0.1:6222", "--metrics", ""}); err != nil {
		t.Fatal(err)
	}
	if c.NATSURL != "nats://127.0.0.1:6222" || c.MetricsAddr != "" {
		t.Fatalf("flags did not override the environment: %+v", c)
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
