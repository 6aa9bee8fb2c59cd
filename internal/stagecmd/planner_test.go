package stagecmd_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/internal/stagecmd"
)

func TestPlannerFlags(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		env     string
		wantOn  bool
		wantKey string
		wantErr string
	}{
		{"no endpoint: no planner", nil, "", false, "", ""},
		{"url and model: the key from the environment", []string{"--llm-url", "http://127.0.0.1:1/v1", "--llm-model", "m"}, "from-env", true, "from-env", ""},
		{"the key file wins over the environment", []string{"--llm-url", "http://127.0.0.1:1/v1", "--llm-model", "m", "--llm-key-file", keyFile}, "from-env", true, "from-file", ""},
		{"a url without a model is refused", []string{"--llm-url", "http://127.0.0.1:1/v1"}, "", false, "", "go together"},
		{"a missing key file is refused", []string{"--llm-url", "u", "--llm-model", "m", "--llm-key-file", keyFile + ".absent"}, "", false, "", "--llm-key-file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(scaffold.EnvLLMAPIKey, tc.env)
			var f scaffold.PlannerFlags
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			f.Register(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			o, err := stagecmd.PlannerOptions(f)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case (o != nil) != tc.wantOn:
				t.Fatalf("options %+v, want planner on: %v", o, tc.wantOn)
			case o != nil && (o.Model.APIKey != tc.wantKey || o.Budget.MaxSteps != 8):
				t.Fatalf("key %q steps %d, want %q and the default 8", o.Model.APIKey, o.Budget.MaxSteps, tc.wantKey)
			}
		})
	}
}
