package main

import (
	"encoding/json"
	"strings"
	"testing"

	pt "github.com/tollgate-dev/tollgate/internal/pipelinetest"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/tools"
)

const cliGrantPolicy = `{
  "version": "cli-grants-1",
  "default_approval": "required",
  "tools": {
    "count": {"approval": "required", "grants": [
      {"option": "approve-day", "scope": "requester", "for": "24h"}
    ]}
  },
  "transports": {"cli": {"trust_boundary": "local", "interactive": true}}
}`

// TestGrantsCommand makes a grant through a prompt, sees it decide a later
// call, and lists, shows and revokes it with `tollgate grants`, in text and
// JSON; after the revocation the next call is prompted again.
func TestGrantsCommand(t *testing.T) {
	count := &pt.Counter{}
	h := pt.Start(t, pt.Options{Policy: cliGrantPolicy, Tools: []tools.Tool{count}})
	url := "--nats=" + h.Env.URL()

	turn1 := h.Send(h.Inbound("s-cli-1", "alice", pt.Call("count", `{}`)))
	id1 := schemas.ApprovalID(turn1, 0)
	h.WaitPending(id1)

	t.Run("pending and show say what the grant option covers", func(t *testing.T) {
		for _, args := range [][]string{{"pending"}, {"show", id1}} {
			code, out, errOut := runCLI(t, append(args, url)...)
			if code != 0 || !strings.Contains(out, "approve-day") ||
				!strings.Contains(out, "approve every count call by cli:alice in any of their sessions") || !strings.Contains(out, "for 24h") {
				t.Fatalf("%v: exit %d, stderr %q:\n%s", args, code, errOut, out)
			}
		}
	})

	if code, _, _ := runCLI(t, "approve", id1, "--as", "alice", "--grant", "deny-day", url); code != 2 {
		t.Fatalf("approve --grant deny-day: exit %d, want 2", code)
	}
	code, out, errOut := runCLI(t, "approve", id1, "--as", "alice", "--grant", "approve-day", url)
	if code != 0 || !strings.Contains(out, "approved "+id1) || !strings.Contains(out, "grant g-") {
		t.Fatalf("approve --grant: exit %d, stderr %q:\n%s", code, errOut, out)
	}
	gid := strings.Fields(out[strings.Index(out, "grant g-"):])[1]
	if !schemas.IsGrantID(gid) {
		t.Fatalf("grant id %q", gid)
	}
	h.WaitTerminal(turn1)
	h.WaitGrant(gid)
	turn2 := h.Send(h.Inbound("s-cli-2", "alice", pt.Call("count", `{}`)))
	id2 := schemas.ApprovalID(turn2, 0)
	h.WaitTerminal(turn2)
	if count.Runs(schemas.CallID(turn2, 0)) != 1 {
		t.Fatal("the granted call did not run")
	}

	t.Run("list", func(t *testing.T) {
		code, out, errOut := runCLI(t, "grants", "list", url)
		if code != 0 || !strings.Contains(out, gid) || !strings.Contains(out, "live") || !strings.Contains(out, "cli:alice") {
			t.Fatalf("exit %d, stderr %q:\n%s", code, errOut, out)
		}
		code, out, _ = runCLI(t, "grants", "list", url, "--json", "--tool", "count")
		var got []struct {
			GrantID string `json:"grant_id"`
			State   string `json:"state"`
		}
		if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 1 || got[0].GrantID != gid || got[0].State != "live" {
			t.Fatalf("exit %d, %v: %+v\n%s", code, err, got, out)
		}
		code, out, _ = runCLI(t, "grants", "list", url, "--json", "--tool", "echo")
		if code != 0 || strings.TrimSpace(out) != "[]" {
			t.Fatalf("filtered list: exit %d:\n%s", code, out)
		}
	})

	t.Run("show lists what it approved", func(t *testing.T) {
		var out string
		jstest.Eventually(t, pt.Wait, "grant show lists approval "+id2, func() bool {
			_, out, _ = runCLI(t, "grants", "show", gid, url)
			return strings.Contains(out, id2)
		})
		for _, want := range []string{gid + " (live)", "approve-day", "cli:alice", id1, "cli-grants-1"} {
			if !strings.Contains(out, want) {
				t.Fatalf("show does not say %q:\n%s", want, out)
			}
		}
		code, js, _ := runCLI(t, "grants", "show", gid, url, "--json")
		var got struct {
			GrantID  string `json:"grant_id"`
			Approved []struct {
				ApprovalID string `json:"approval_id"`
			} `json:"approved"`
		}
		if err := json.Unmarshal([]byte(js), &got); code != 0 || err != nil || got.GrantID != gid || len(got.Approved) != 1 || got.Approved[0].ApprovalID != id2 {
			t.Fatalf("exit %d, %v: %+v\n%s", code, err, got, js)
		}
	})

	t.Run("revoke", func(t *testing.T) {
		code, out, errOut := runCLI(t, "grants", "revoke", gid, "--reason", "done", "--by", "ops", url, "--json")
		var got struct {
			State   string `json:"state"`
			Revoked struct {
				By     string `json:"by"`
				Reason string `json:"reason"`
			} `json:"revoked"`
		}
		if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got.State != "revoked" || got.Revoked.By != "ops" || got.Revoked.Reason != "done" {
			t.Fatalf("exit %d, %v, stderr %q: %+v\n%s", code, err, errOut, got, out)
		}
		code, out, _ = runCLI(t, "grants", "list", url)
		if code != 0 || strings.Contains(out, gid) {
			t.Fatalf("a revoked grant is listed as live:\n%s", out)
		}
		code, out, _ = runCLI(t, "grants", "list", "--all", url)
		if code != 0 || !strings.Contains(out, gid) || !strings.Contains(out, "revoked") {
			t.Fatalf("list --all:\n%s", out)
		}
		turn3 := h.Send(h.Inbound("s-cli-3", "alice", pt.Call("count", `{}`)))
		if a := h.WaitPending(schemas.ApprovalID(turn3, 0)); a.Decision != nil {
			t.Fatalf("decided after the revocation: %+v", a.Decision)
		}
	})

	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{{"grants"}, {"grants", "frob"}, {"grants", "show"}, {"grants", "list", "x"}} {
			if code, _, _ := runCLI(t, append(args, url)...); code != 2 {
				t.Fatalf("%v: exit %d, want 2", args, code)
			}
		}
		if code, _, errOut := runCLI(t, "grants", "show", "a-not-a-grant", url); code != 1 || !strings.Contains(errOut, "not a grant id") {
			t.Fatalf("exit %d: %q", code, errOut)
		}
		if code, _, errOut := runCLI(t, "grants", "revoke", "g-0000", url); code != 1 || !strings.Contains(errOut, "no grant") {
			t.Fatalf("exit %d: %q", code, errOut)
		}
	})
}
