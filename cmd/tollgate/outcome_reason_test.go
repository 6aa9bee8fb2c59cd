package main

import (
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// outcome says a call's code once before its reason: a call of a tool
// that does not exist and one whose arguments do not fit the tool's
// schema fail with TOOL_NOT_FOUND and ARGS_INVALID, each said once, and
// the reason is not cut before it names the property that is wrong.
func TestOutcomeSaysACodeOnce(t *testing.T) {
	h := pt.Start(t, pt.Options{})
	turn := h.Send(h.Inbound("s-codes", "alice", pt.Call("no_such_tool", `{}`), pt.Call("echo", `{"text":3}`),
		pt.Call("write_file", `{"path":"a","content":"b","a_property_write_file_does_not_have":1}`)))
	h.WaitTerminal(turn)
	code, out, errOut := runCLI(t, "outcome", turn, "--nats="+h.Env.URL())
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, c := range []schemas.Code{schemas.CodeToolNotFound, schemas.CodeArgsInvalid} {
		if !strings.Contains(out, string(c)+": ") || strings.Contains(out, string(c)+": "+string(c)) {
			t.Errorf("outcome does not say %s once:\n%s", c, out)
		}
	}
	if !strings.Contains(out, "a_property_write_file_does_not_have") {
		t.Errorf("the ARGS_INVALID reason is cut before it names the property:\n%s", out)
	}
}
