package discord_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/schemas"
	"github.com/tollgate-dev/tollgate/transport/discord"
)

// Each attack gets its status and reason, and publishes nothing it should
// not: no decision for a refused click, no inbound message for a refused
// command.
func TestAdversarialInteractions(t *testing.T) {
	r := startRig(t)
	dm := dmOf("111")
	staff := where{guild: guild, channel: "C-staff", typ: 0}
	r.discord.mu.Lock()
	r.discord.chans["C-staff"] = map[string]any{"id": "C-staff", "type": 0, "guild_id": guild,
		"permission_overwrites": []any{map[string]any{"id": guild, "type": 0, "allow": "0", "deny": "1024"}}}
	r.discord.mu.Unlock()
	// Two pending DM prompts, one that expires, and a team prompt in a
	// private guild channel.
	idA := r.askOK(t, "111", dm, "write a.txt")
	idB := r.askOK(t, "111", dm, "write b.txt")
	idE := r.askOK(t, "111", dm, "echo soon")
	idG := r.askOK(t, "111", staff, "write g.txt")
	pA, pB, pE, pG := r.promptOf(t, idA), r.promptOf(t, idB), r.promptOf(t, idE), r.promptOf(t, idG)
	if pG.channel() != "C-staff" {
		t.Fatalf("team prompt went to %s, want the channel", pG.channel())
	}
	r.awaitStatus(t, idE, schemas.ApprovalExpired)
	r.discord.await(t, 1, http.MethodPatch, "/channels/DM111/messages/"+pE.id, func(c call) bool { return strings.Contains(c.content(), "Expired") })

	_, forger, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	approveA := customID(t, pA, "Approve")
	otherDigest := approveA[:strings.LastIndex(approveA, ":")+1] + "sha256:0000"
	notAuthorized := click("222", staff, pG.id, customID(t, pG, "Approve"))
	aged := click("111", dm, pA.id, approveA)
	now := time.Now()
	rows := []struct {
		name      string
		send      func(t *testing.T) answer
		status    int
		reason    string
		stream    string // whose message count must not grow
		published uint64 // how many messages it may add
	}{
		{"a forged signature is refused", func(t *testing.T) answer {
			return signedPost(t, r.http.URL, forger, click("111", dm, pA.id, approveA), now)
		}, 401, discord.ReasonBadSignature, topology.StreamDecisions, 0},
		{"an interaction signed more than 5 minutes ago is refused", func(t *testing.T) answer {
			return signedPost(t, r.http.URL, r.key, aged, now.Add(-6*time.Minute))
		}, 401, discord.ReasonStaleTimestamp, topology.StreamDecisions, 0},
		{"a custom_id Tollgate never sent is refused", func(t *testing.T) answer {
			return r.send(t, click("111", dm, pA.id, "tg-launch:"+idA+":x"))
		}, 400, discord.ReasonUnknownAction, topology.StreamDecisions, 0},
		{"a custom_id edited to another approval is refused", func(t *testing.T) answer {
			return r.send(t, click("111", dm, pA.id, customID(t, pB, "Approve")))
		}, 400, discord.ReasonActionMismatch, topology.StreamDecisions, 0},
		{"a custom_id with another digest is refused", func(t *testing.T) answer {
			return r.send(t, click("111", dm, pA.id, otherDigest))
		}, 400, discord.ReasonActionMismatch, topology.StreamDecisions, 0},
		{"a click on an expired prompt publishes nothing", func(t *testing.T) answer {
			a := r.send(t, click("111", dm, pE.id, customID(t, pE, "Approve")))
			if a.typ != 4 || a.data["flags"] != float64(64) || !strings.Contains(a.content(), string(schemas.CodeApprovalExpired)) {
				t.Errorf("answer: %+v, want an ephemeral message with the code", a)
			}
			return a
		}, 200, discord.ReasonNotPending, topology.StreamDecisions, 0},
		{"a click by a user who may not decide goes to the approver", func(t *testing.T) answer {
			return r.send(t, notAuthorized)
		}, 200, "", topology.StreamDecisions, 1},
		{"the same signed click again within the window is a replay", func(t *testing.T) answer {
			return r.send(t, notAuthorized)
		}, 400, discord.ReasonReplayed, topology.StreamDecisions, 0},
		{"a bot user's command is not a turn", func(t *testing.T) answer {
			body, _ := ask("999", dm, "write evil.txt")
			return r.send(t, []byte(strings.Replace(string(body), `"username":"u999"`, `"username":"u999","bot":true`, 1)))
		}, 400, discord.ReasonBotMessage, topology.StreamInbound, 0},
		{"an unknown command is refused", func(t *testing.T) answer {
			body, _ := ask("111", dm, "write evil.txt")
			return r.send(t, []byte(strings.Replace(string(body), `"name":"ask"`, `"name":"launch"`, 1)))
		}, 400, discord.ReasonUnknownAction, topology.StreamInbound, 0},
		{"a body altered after signing is refused", func(t *testing.T) answer {
			body, _ := ask("111", dm, "write a.txt")
			ts := strconv.FormatInt(now.Unix(), 10)
			req, _ := http.NewRequest(http.MethodPost, r.http.URL+"/discord/interactions", strings.NewReader(strings.Replace(string(body), "a.txt", "z.txt", 1)))
			req.Header.Set("X-Signature-Timestamp", ts)
			req.Header.Set("X-Signature-Ed25519", discord.Sign(r.key, ts, body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return answer{status: resp.StatusCode}
		}, 401, discord.ReasonBadSignature, topology.StreamInbound, 0},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			before, refused := r.msgs(t, row.stream), r.refused(t, row.reason)
			a := row.send(t)
			if a.status != row.status {
				t.Errorf("status %d, want %d", a.status, row.status)
			}
			if got := r.msgs(t, row.stream) - before; got != row.published {
				t.Errorf("%s grew by %d, want %d", row.stream, got, row.published)
			}
			if row.reason != "" && r.refused(t, row.reason) != refused+1 {
				t.Errorf("tollgate_discord_refused_total{reason=%q} did not grow", row.reason)
			}
		})
	}

	// The approver refused the unauthorized clicker: an ephemeral
	// follow-up on their click with the code, and the prompt stays open.
	fu := r.discord.await(t, 1, http.MethodPost, "/webhooks/"+appID+"/", nil)[0]
	if fu.body["flags"] != float64(64) || !strings.Contains(fu.content(), string(schemas.CodeDeciderNotAuthorized)) || fu.auth != "" {
		t.Errorf("rejection follow-up: %+v", fu)
	}
	if s := r.approvalStatus(t, idG); s != schemas.ApprovalPending {
		t.Errorf("team approval is %s after an unauthorized click, want pending", s)
	}
	if n := len(r.discord.find(http.MethodPatch, "/channels/C-staff/", nil)); n != 0 {
		t.Errorf("the team prompt was edited %d times after a rejected click", n)
	}
	// The requester can still decide it from the channel.
	if a := r.send(t, click("111", staff, pG.id, customID(t, pG, "Approve"))); a.status != 200 {
		t.Fatalf("requester's click: %d", a.status)
	}
	r.awaitStatus(t, idG, schemas.ApprovalApproved)
	// Nothing decided A or B.
	for _, id := range []string{idA, idB} {
		if s := r.approvalStatus(t, id); s != schemas.ApprovalPending {
			t.Errorf("approval %s is %s, want pending", id, s)
		}
	}
}

// A request captured and replayed more than 5 minutes later is refused for
// its timestamp, though its signature is still valid.
func TestReplayAfterFiveMinutesIsRefused(t *testing.T) {
	r := startRig(t)
	body, _ := ask("111", dmOf("111"), "hello")
	signedAt := time.Now().Add(-5*time.Minute - 2*time.Second)
	if a := signedPost(t, r.http.URL, r.key, body, signedAt.Add(5*time.Minute-time.Second)); a.status != 200 {
		t.Fatalf("the original request: %d", a.status)
	}
	before := r.msgs(t, topology.StreamInbound)
	// A fresh interaction id, signed 5 min 2 s ago: only the window stops it.
	other, _ := ask("111", dmOf("111"), "hello again")
	if a := signedPost(t, r.http.URL, r.key, other, signedAt); a.status != 401 {
		t.Errorf("replay after 5 minutes: %d, want 401", a.status)
	}
	if r.msgs(t, topology.StreamInbound) != before || r.refused(t, discord.ReasonStaleTimestamp) != 1 {
		t.Error("a stale interaction was published or not counted")
	}
}

// A personal-audience prompt goes to the requester's own DM, opened with
// POST /users/@me/channels, never to another channel, even when the turn
// came from a different DM channel.
func TestPersonalPromptGoesOnlyToTheRequestersDM(t *testing.T) {
	r := startRig(t)
	id := r.askOK(t, "111", where{channel: "DM-other", typ: 1}, "write p.txt")
	p := r.promptOf(t, id)
	if p.channel() != "DM111" {
		t.Errorf("personal prompt posted to %s, want the requester's DM DM111", p.channel())
	}
	if open := r.discord.find(http.MethodPost, "/users/@me/channels", func(c call) bool { return c.body["recipient_id"] == "111" }); len(open) == 0 {
		t.Error("the requester's DM was not opened")
	}
	if n := len(r.discord.find(http.MethodPost, "/channels/", func(c call) bool { return !strings.HasPrefix(c.channel(), "DM111") })); n != 0 {
		t.Errorf("%d messages went to another channel: %s", n, r.discord.dump())
	}
}
