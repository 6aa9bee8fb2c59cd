package gatewaycmd

import (
	"encoding/json"
	"io"
	"os"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/scaffold"
	"github.com/tollgate-dev/tollgate/transport/gateway"
)

// TestNewKeyPrintsATokenAndItsStoredForm: `gateway newkey` prints a token
// and the keys-file entry holding only its hash, which LoadKeys accepts;
// an unknown scope is refused.
func TestNewKeyPrintsATokenAndItsStoredForm(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	code := Main(scaffold.Prog{Name: "gateway"}, []string{"newkey", "--transport", "agents", "--scopes", "submit, read", "--vouch"})
	os.Stdout = saved
	w.Close()
	out, _ := io.ReadAll(r)
	var got struct {
		Token string      `json:"token"`
		Key   gateway.Key `json:"key"`
	}
	if code != 0 || json.Unmarshal(out, &got) != nil {
		t.Fatalf("exit %d: %s", code, out)
	}
	k := got.Key
	if k.Hash != gateway.HashToken(got.Token) || k.Transport != "agents" || !k.VouchVerified || len(k.Scopes) != 2 || !k.Allows(gateway.ScopeRead) || k.Allows(gateway.ScopeDecide) {
		t.Fatalf("key %+v for token %s", k, got.Token)
	}
	file := t.TempDir() + "/keys.json"
	b, _ := json.Marshal(gateway.KeysFile{Keys: []gateway.Key{k}})
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.LoadKeys(file); err != nil {
		t.Fatalf("LoadKeys of the printed entry: %v", err)
	}
	if code := Main(scaffold.Prog{Name: "gateway"}, []string{"newkey", "--scopes", "root"}); code != 2 {
		t.Fatalf("an unknown scope: exit %d, want 2", code)
	}
	if code := Main(scaffold.Prog{Name: "gateway"}, nil); code != 2 {
		t.Fatalf("serve without --keys: exit %d, want 2", code)
	}
}
