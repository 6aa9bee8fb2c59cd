package gateway

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/schemas"
)

// privateLines are the lines of a file another transport wrote, which a
// preview of a write over it would show as removed.
var privateLines = []string{"salary 123456", "bank PIN 4242"}

// TestAPreviewDisclosesNothingToWhoMayNotDecide (docs/security.md rule 17;
// issue 35's reproduction): a submit-only key asks write_file over a file
// another transport wrote. Its own 202 answer, the read-only key's list,
// approval and turn, the turn's event stream (even a deciding key's) and
// the approval.requested event on the bus have the preview's summary
// only: status, kind, "+1 -2 lines", never the old lines. A key with scope
// decide on the transport reads the whole diff.
func TestAPreviewDisclosesNothingToWhoMayNotDecide(t *testing.T) {
	var submitOnly string
	g := startGateway(t, pipelinetest.Options{}, func(c *Config) {
		tok, k := NewKey("gateway", []Scope{ScopeSubmit}, true)
		submitOnly = tok
		c.Keys = append(c.Keys, k)
	})
	g.tokens["submitonly"] = submitOnly
	if err := os.MkdirAll(filepath.Join(g.Sandbox, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.Sandbox, "notes", "alice-private.txt"), []byte(strings.Join(privateLines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	leaks := func(body []byte) bool {
		for _, l := range privateLines {
			if strings.Contains(string(body), l) {
				return true
			}
		}
		return false
	}
	summaryOnly := func(where string, p *PreviewView) {
		t.Helper()
		if p == nil || !p.Redacted || p.Text != "" || p.TextVisible != "" || p.Reason != "" || p.Status != schemas.PreviewOK ||
			p.Kind != schemas.PreviewKindDiff || p.Summary != "+1 -2 lines" || p.Added != 1 || p.Removed != 2 || p.At.IsZero() {
			t.Errorf("%s: preview %+v, want the summary only (+1 -2 lines)", where, p)
		}
	}

	resp, body := g.do("POST", "/v1/turns", "submitonly", submitBody("s-private", "mallory",
		call("write_file", `{"path":"notes/alice-private.txt","content":"x"}`)))
	sub := want[SubmitResponse](t, resp, body, http.StatusAccepted)
	if len(sub.Calls) != 1 || sub.Calls[0].Approval == nil {
		t.Fatalf("submit answered %s, want the pending approval", body)
	}
	if leaks(body) {
		t.Errorf("the submit-only key's own answer holds the old lines: %s", body)
	}
	summaryOnly("the submit-only key's 202", sub.Calls[0].Approval.Preview)
	id := sub.Calls[0].ApprovalID

	for _, tc := range []struct {
		name, key, path string
		whole           bool
	}{
		{"a read-only key lists the approvals", "readonly", "/v1/approvals", false},
		{"a read-only key reads the approval", "readonly", "/v1/approvals/" + id, false},
		{"a read-only key reads the turn", "readonly", "/v1/turns/" + sub.TurnID, false},
		{"a deciding key lists the approvals", "a", "/v1/approvals", true},
		{"a deciding key reads the approval", "a", "/v1/approvals/" + id, true},
		{"a deciding key reads the turn", "a", "/v1/turns/" + sub.TurnID, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := g.do("GET", tc.path, tc.key, nil)
			var p *PreviewView
			switch {
			case strings.HasPrefix(tc.path, "/v1/turns/"):
				v := want[TurnView](t, resp, body, http.StatusOK)
				p = v.Calls[0].Approval.Preview
			case tc.path == "/v1/approvals":
				l := want[ApprovalList](t, resp, body, http.StatusOK)
				if len(l.Approvals) != 1 {
					t.Fatalf("list %s, want the one approval", body)
				}
				p = l.Approvals[0].Preview
			default:
				p = want[ApprovalView](t, resp, body, http.StatusOK).Preview
			}
			if !tc.whole {
				if leaks(body) {
					t.Errorf("%s answered the old lines: %s", tc.key, body)
				}
				summaryOnly(tc.path, p)
				return
			}
			if p == nil || p.Redacted || !strings.Contains(p.Text, "-"+privateLines[0]+"\n") || p.Summary != "+1 -2 lines" {
				t.Errorf("a deciding key's preview %+v, want the whole diff", p)
			}
		})
	}

	t.Run("the turn's event stream", func(t *testing.T) {
		stream := g.openSSE("/v1/turns/"+sub.TurnID+"/events", "a")
		for {
			ev := stream.nextEvent(t, 10*time.Second)
			if ev.kind != "approval.requested" {
				continue
			}
			if leaks([]byte(ev.data)) || !strings.Contains(ev.data, `"redacted":true`) || !strings.Contains(ev.data, `"removed":2`) {
				t.Errorf("approval.requested event %s, want the summary only", ev.data)
			}
			return
		}
	})

	t.Run("the approval.requested event on the bus", func(t *testing.T) {
		reqs := g.Requested(sub.TurnID)
		if len(reqs) != 1 || reqs[0].Preview == nil || !reqs[0].Preview.Redacted || reqs[0].Preview.Text != "" ||
			reqs[0].Preview.Removed != 2 || reqs[0].Preview.Added != 1 {
			t.Fatalf("approval.requested events %+v, want one with the summary only", reqs)
		}
	})

	// The stored record keeps the whole preview: the deciders' surfaces
	// read it.
	if a := g.Approval(id); a.Preview == nil || a.Preview.Redacted || !strings.Contains(a.Preview.Text, privateLines[1]) {
		t.Fatalf("stored preview %+v, want the whole diff", a.Preview)
	}
}
