package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/reveal"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestApprovalViewFlagsHostileCharacters: a call holding every row of
// reveal.HostileExamples is read over the API with its exact args, and
// args_flagged with args_visible: the same value, each such character
// escaped, none raw. A plain call is not flagged and args_visible is args.
func TestApprovalViewFlagsHostileCharacters(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	got := g.submit("a", submitBody("s-hostile", "alice", call("write_file", reveal.HostileArgs())))
	_, plain := g.submitGated("a", "s-plain", "alice")
	canonical, _, err := schemas.CanonicalArgs(reveal.HostileArgs())
	if err != nil {
		t.Fatal(err)
	}
	resp, body := g.do("GET", "/v1/approvals/"+got.Calls[0].ApprovalID, "a", nil)
	a := want[ApprovalView](t, resp, body, http.StatusOK)
	if a.Args != canonical || !a.ArgsFlagged || reveal.Contains(a.ArgsVisible) {
		t.Fatalf("args %q flagged %v visible %q: want the exact args, flagged, and a visible form", a.Args, a.ArgsFlagged, a.ArgsVisible)
	}
	var exact, visible any
	if json.Unmarshal([]byte(a.Args), &exact) != nil || json.Unmarshal([]byte(a.ArgsVisible), &visible) != nil {
		t.Fatalf("args or args_visible is not JSON: %q %q", a.Args, a.ArgsVisible)
	}
	if e, v := mustJSON(t, exact), mustJSON(t, visible); e != v {
		t.Errorf("args_visible decodes to %s, args to %s", v, e)
	}
	for _, ex := range reveal.HostileExamples {
		if !strings.Contains(a.ArgsVisible, ex.InJSON()) {
			t.Errorf("%s: args_visible does not show %s", ex.Name, ex.InJSON())
		}
	}
	resp, body = g.do("GET", "/v1/approvals?status=pending", "a", nil)
	for _, v := range want[ApprovalList](t, resp, body, http.StatusOK).Approvals {
		switch v.ApprovalID {
		case a.ApprovalID:
			if !v.ArgsFlagged || v.ArgsVisible != a.ArgsVisible {
				t.Errorf("listed %+v, want it flagged as read", v)
			}
		case plain.ApprovalID:
			if v.ArgsFlagged || v.ArgsVisible != v.Args {
				t.Errorf("plain call listed %+v: want it not flagged, args_visible = args", v)
			}
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
