package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
)

// TestBodyFieldNamesAreMatchedExactly: encoding/json folds case (and
// Unicode: "ſ" is "s"); the gateway refuses a body field whose exact
// spelling is not the field's name, INVALID_INPUT naming it, on turns,
// decisions and hooks alike, and nothing is published.
func TestBodyFieldNamesAreMatchedExactly(t *testing.T) {
	g := startGateway(t, pipelinetest.Options{}, nil)
	call := `"calls":[{"tool":"echo","args":{"text":"hi"}}]`
	for _, tc := range []struct{ name, path, body, field string }{
		{"long s", "/v1/turns", `{"ſession_id":"s1","sender":{"id":"alice"},` + call + `}`, "ſession_id"},
		{"mixed case", "/v1/turns", `{"Session_ID":"s1","sender":{"id":"alice"},` + call + `}`, "Session_ID"},
		{"nested upper case", "/v1/turns", `{"session_id":"s1","sender":{"id":"alice"},"calls":[{"TOOL":"echo","args":{}}]}`, "calls.0.TOOL"},
		{"nested object", "/v1/turns", `{"session_id":"s1","sender":{"ID":"alice"},` + call + `}`, "sender.ID"},
		{"decision", "/v1/approvals/no-such/decisions", `{"OPTION":"approve","args_digest":"x","decider":{"id":"alice"}}`, "OPTION"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := g.do("POST", tc.path, "a", []byte(tc.body))
			p := wantProblem(t, resp, body, http.StatusBadRequest, schemas.CodeInvalidInput)
			if !strings.Contains(p.Detail, `"`+tc.field+`"`) {
				t.Fatalf("detail %q does not name the field %q", p.Detail, tc.field)
			}
		})
	}
	t.Run("hook", func(t *testing.T) {
		body := `{"session_id":"s1","hook_event_name":"PreToolUse","TOOL_NAME":"Bash","tool_input":{"command":"ls"},"tool_use_id":"toolu_1","cwd":"/w"}`
		resp, data := g.do("POST", "/v1/hooks/pretooluse", "a", []byte(body))
		out := want[HookOutput](t, resp, data, http.StatusOK).HookSpecificOutput
		if out.PermissionDecision != "deny" || !strings.HasPrefix(out.PermissionDecisionReason, string(schemas.CodeInvalidInput)+": ") || !strings.Contains(out.PermissionDecisionReason, `"TOOL_NAME"`) {
			t.Fatalf("hook decision %+v; want a deny INVALID_INPUT naming TOOL_NAME", out)
		}
	})
	// The exact spelling is accepted (the refusals above are about the
	// names, not the requests).
	var ok SubmitResponse
	resp, body := g.do("POST", "/v1/turns", "a", []byte(`{"session_id":"s1","sender":{"id":"alice"},`+call+`}`))
	ok = want[SubmitResponse](t, resp, body, http.StatusAccepted)
	if n := g.count(topology.StreamInbound, "tollgate.inbound.>"); n != 1 {
		t.Fatalf("%d inbound messages; want only the exactly spelled turn's (%s)", n, must(json.Marshal(ok)))
	}
}

func must(b []byte, _ error) string { return string(b) }
