package natstool_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/jstest"
	"github.com/tollgate-dev/tollgate/tools"
	"github.com/tollgate-dev/tollgate/tools/natstool"
)

// A tool service offers a preview with an endpoint named by the tool's
// "tollgate.preview" metadata. The preview gets the call's id and
// arguments (no turn context), and its answer, a service error, a reply
// that is no preview, and no answer in time each come out of
// tools.PreviewCall as ok, failed, failed and timed_out; a tool without a
// preview subject is unsupported; a preview subject outside the tool's
// prefix makes no tool.
func TestPreviewEndpointOfAToolService(t *testing.T) {
	env := jstest.Start(t)
	nc := connect(t, env)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var got []natstool.PreviewRequest
	seen := make(chan natstool.PreviewRequest, 8)
	pv := func(name string) map[string]string {
		return tool(natstool.MetaPreview, natstool.SubjectPrefix+"files."+name+".preview")
	}
	addService(t, nc, "files",
		endpoint{name: "write", meta: pv("write")},
		endpoint{name: "write_preview", subject: natstool.SubjectPrefix + "files.write.preview", meta: map[string]string{},
			handler: func(req micro.Request) {
				var r natstool.PreviewRequest
				_ = json.Unmarshal(req.Data(), &r)
				seen <- r
				_ = req.RespondJSON(natstool.PreviewReply{Kind: tools.PreviewDiff, Text: "--- a\n+++ a\n@@ -1 +1 @@\n-x\n+" + string(r.Args) + "\n"})
			}},
		endpoint{name: "broken", meta: pv("broken")},
		endpoint{name: "broken_preview", subject: natstool.SubjectPrefix + "files.broken.preview", meta: map[string]string{},
			handler: func(req micro.Request) { _ = req.Error("503", "disk offline", nil) }},
		endpoint{name: "odd", meta: pv("odd")},
		endpoint{name: "odd_preview", subject: natstool.SubjectPrefix + "files.odd.preview", meta: map[string]string{},
			handler: func(req micro.Request) { _ = req.Respond([]byte(`{"kind":"rm -rf","text":"x"}`)) }},
		endpoint{name: "stuck", meta: pv("stuck")},
		endpoint{name: "stuck_preview", subject: natstool.SubjectPrefix + "files.stuck.preview", meta: map[string]string{},
			handler: func(req micro.Request) { <-release }},
		endpoint{name: "gone", meta: pv("gone")}, // names a subject nobody serves
		endpoint{name: "plain"},
		endpoint{name: "elsewhere", meta: tool(natstool.MetaPreview, natstool.SubjectPrefix+"other.x")},
	)
	p := newProvider(env, natstool.Options{})
	byName := map[string]tools.Tool{}
	all, err := p.Tools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range all {
		byName[tl.Name()] = tl
	}
	if _, ok := byName["files.elsewhere"]; ok {
		t.Fatal("a tool whose preview subject leaves its prefix was offered")
	}
	if _, ok := byName["files.write_preview"]; ok {
		t.Fatal("a preview endpoint (no tollgate metadata) was offered as a tool")
	}
	call := tools.Call{CallID: "c-1", Args: `{"path":"a"}`}
	for _, tc := range []struct {
		tool, status, has string
	}{
		{"files.write", tools.PreviewOK, `+{"path":"a"}`},
		{"files.broken", tools.PreviewFailed, "disk offline"},
		{"files.odd", tools.PreviewFailed, `kind "rm -rf"`},
		{"files.stuck", tools.PreviewTimedOut, "200ms"},
		{"files.gone", tools.PreviewFailed, "no service answers"},
		{"files.plain", tools.PreviewUnsupported, ""},
	} {
		tl := byName[tc.tool]
		if tl == nil {
			t.Fatalf("tool %s not offered", tc.tool)
		}
		r := tools.PreviewCall(context.Background(), tl, call, 200*time.Millisecond)
		if r.Status != tc.status || !strings.Contains(r.Text+r.Reason, tc.has) {
			t.Errorf("%s: preview %+v, want %s with %q", tc.tool, r, tc.status, tc.has)
		}
	}
	select {
	case r := <-seen:
		got = append(got, r)
	default:
	}
	if len(got) != 1 || got[0].CallID != "c-1" || got[0].Tool != "files.write" || string(got[0].Args) != call.Args {
		t.Fatalf("preview endpoint got %+v, want the call's id and arguments", got)
	}
}
