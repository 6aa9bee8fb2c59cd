package scaffold_test

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
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
	var c scaffold.Common
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := scaffold.Common{NATSURL: "nats://127.0.0.1:5222", Creds: "/etc/tollgate/executor.creds", MetricsAddr: "127.0.0.1:9999",
		LogLevel: "debug", Replicas: 3, PolicyPath: "/etc/tollgate/policy.json", SandboxDir: "/var/lib/tollgate/sandbox",
		ToolServices: false, ToolsFile: "/etc/tollgate/tools.json", Retention: 1440 * time.Hour,
		Account: scaffold.Account{InboxPrefix: "_INBOX_executor", APIPrefix: "JS.TOLLGATE.API"}}
	if c != want {
		t.Fatalf("from the environment: %+v, want %+v", c, want)
	}

	// A flag beats the environment.
	fs = flag.NewFlagSet("y", flag.ContinueOnError)
	c.Register(fs, "127.0.0.1:1")
	if err := fs.Parse([]string{"--nats", "nats://127.0.0.1:6222", "--metrics", "", "--tool-services", "--tools", ""}); err != nil {
		t.Fatal(err)
	}
	if c.NATSURL != "nats://127.0.0.1:6222" || c.MetricsAddr != "" || !c.ToolServices || c.ToolsFile != "" {
		t.Fatalf("flags did not override the environment: %+v", c)
	}
}

// Account.Connect gives the connection its account's inbox prefix and the
// JetStream handle its API prefix; the zero Account keeps nats.go's
// defaults, and so do the flags' defaults.
func TestAccountConnectUsesItsPrefixes(t *testing.T) {
	env := jstest.Start(t)
	for _, tc := range []struct {
		name       string
		account    scaffold.Account
		inbox, api string
	}{
		{"zero", scaffold.Account{}, "_INBOX.", ""},
		{"the flags' defaults", scaffold.Account{InboxPrefix: "_INBOX", APIPrefix: "$JS.API"}, "_INBOX.", "$JS.API"},
		{"in an account of its own", scaffold.Account{InboxPrefix: "_INBOX_executor", APIPrefix: "JS.TOLLGATE.API"},
			"_INBOX_executor.", "JS.TOLLGATE.API"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, js, err := tc.account.Connect(env.Server.ClientURL(), "", "scaffold-test", pipelinetest.Logger())
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
