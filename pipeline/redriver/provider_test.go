package redriver_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

// providerPolicy is policy A of the provider tool tests: the tools of
// service svc need an approval, which the requester may give.
const providerPolicy = `{
  "version": "%s",
  "default_approval": "required",
  "tools": {%s},
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

func svcTool(name string, destructive bool) *pt.Remote {
	return &pt.Remote{Counter: pt.Counter{ToolName: name}, Desc: tools.Spec{
		Source: "nats:svc", InputSchema: json.RawMessage(`{"type":"object"}`),
		Hints: tools.Hints{Destructive: &destructive},
	}}
}

// What becomes of an approved call of a provider's tool when its tool or
// the policy changed between the approval and the redrive: a tool that
// disappeared fails closed with TOOL_NOT_FOUND, and the POLICY_CHANGED
// re-check applies by pattern and with the tool's current hints. The
// approval is decided under policy A by a pipeline without a redriver;
// a redriver under policy B then runs the batch.
func TestAnApprovedProviderToolIsCheckedAgainBeforeItRuns(t *testing.T) {
	tests := []struct {
		name        string
		destructive bool
		b           string // policy B's tool rules
		gone        bool   // the provider no longer has the tool
		want        want
	}{
		{name: "the tool is unchanged", b: `"svc.*": {"approval": "required"}`, want: runs},
		{name: "the tool disappeared", b: `"svc.*": {"approval": "required"}`, gone: true,
			want: want{schemas.ResultFailed, schemas.CodeToolNotFound}},
		{name: "a pattern now denies the tool", b: `"svc.*": {"approval": "deny"}`, want: policyChanged},
		{name: "a longer pattern now denies the tool", b: `"svc.*": {"approval": "required"}, "svc.deploy.*": {"approval": "deny"}`, want: policyChanged},
		{name: "a pattern now lets the tool run freely", b: `"svc.*": {"approval": "never"}`, want: runs},
		{name: "a destructive tool is still checked against its deciders under a free pattern",
			destructive: true, b: `"svc.*": {"approval": "never", "deciders": {"requester": false, "principals": ["cli:bob"]}}`, want: policyChanged},
		{name: "a tool that is not destructive runs freely under the same pattern",
			b: `"svc.*": {"approval": "never", "deciders": {"requester": false, "principals": ["cli:bob"]}}`, want: runs},
		{name: "an exact rule naming the tool runs it freely whatever its hints",
			destructive: true, b: `"svc.deploy.prod": {"approval": "never", "deciders": {"requester": false, "principals": ["cli:bob"]}}`, want: runs},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tool := svcTool("svc.deploy.prod", tc.destructive)
			prov := &pt.Provider{ProviderName: "nats"}
			prov.Set(tool)
			policyA := fmt.Sprintf(providerPolicy, "A", `"svc.*": {"approval": "required"}`)
			h := pt.Start(t, pt.Options{Policy: policyA, Providers: []tools.Provider{prov}, Stages: []string{pt.Ingest, pt.Executor, pt.Approver}})
			turn := h.Send(h.Inbound(fmt.Sprintf("provider-recheck-%d", i), "alice", pt.Call("svc.deploy.prod", `{"env":"prod"}`)))
			id := schemas.ApprovalID(turn, 0)
			h.WaitPending(id)
			h.WaitConsumed(pt.Approver, h.Submit(h.Decision(id, schemas.OptionApprove, "cli", "alice")))
			h.WaitApproval(id, "approved", func(a *schemas.ApprovalRecord) bool { return a.Status == schemas.ApprovalApproved })
			h.Stop()
			if tc.gone {
				prov.Set()
			}

			policyB := fmt.Sprintf(providerPolicy, "B", tc.b)
			r := pt.Start(t, pt.Options{Env: h.Env, Keys: h.Keys, Policy: policyB, Providers: []tools.Provider{prov}, Stages: []string{pt.Redriver}})
			b, out := r.WaitTerminal(turn)
			res := b.Results[0]
			if b.State != schemas.BatchCompleted || res.Status != tc.want.status || res.Code != tc.want.code || res.ApprovalID != id || out.Results[0].Code != tc.want.code {
				t.Fatalf("batch %s, result %+v; want %s %s", b.State, res, tc.want.status, tc.want.code)
			}
			if tc.want == policyChanged && !strings.Contains(res.Reason, "policy B") || tc.gone && !strings.Contains(res.Reason, `"svc.deploy.prod"`) {
				t.Fatalf("reason %q names neither the current policy nor the missing tool", res.Reason)
			}
			wantRuns := 0
			if tc.want == runs {
				wantRuns = 1
			}
			if n := tool.Runs(schemas.CallID(turn, 0)); n != wantRuns {
				t.Fatalf("the tool ran %d times, want %d", n, wantRuns)
			}
		})
	}
}
