package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/health"
)

func check(name, stage string, err error) health.Check {
	return health.Check{Name: name, Stage: stage, Check: func(context.Context) error { return err }}
}

// tollgate_ready{stage} is 1 for a stage whose own checks and the shared
// ones pass, 0 otherwise, and 0 for every stage before any check is
// added; /readyz answers 503 naming the failing check, 200 when all pass.
func TestReadinessPerStageAndOverHTTP(t *testing.T) {
	down := errors.New("down")
	for _, tc := range []struct {
		name       string
		checks     []health.Check
		want       string // the gauge, stage a then b
		wantStatus int
	}{
		{"nothing added yet: starting", nil, "0 0", http.StatusServiceUnavailable},
		{"every check passes", []health.Check{check("nats", "", nil), check("a/consumer", "a", nil), check("b/consumer", "b", nil)}, "1 1", http.StatusOK},
		{"one stage's check fails", []health.Check{check("nats", "", nil), check("a/consumer", "a", down), check("b/consumer", "b", nil)}, "0 1", http.StatusServiceUnavailable},
		{"a shared check fails", []health.Check{check("nats", "", down), check("a/consumer", "a", nil), check("b/consumer", "b", nil)}, "0 0", http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			r, err := health.New(reg, "a", "b")
			if err != nil {
				t.Fatal(err)
			}
			r.Add(tc.checks...)
			if got := fmt.Sprint(gauge(t, reg, "a"), " ", gauge(t, reg, "b")); got != tc.want {
				t.Fatalf("tollgate_ready a, b = %s, want %s", got, tc.want)
			}
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			var rep health.Report
			if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil || rec.Code != tc.wantStatus || rep.Ready != (tc.wantStatus == http.StatusOK) {
				t.Fatalf("/readyz: %d %s (%v), want %d", rec.Code, rec.Body, err, tc.wantStatus)
			}
			for i, c := range rep.Checks {
				if i < len(tc.checks) && (c.Name != tc.checks[i].Name || c.OK != (tc.checks[i].Check(context.Background()) == nil)) {
					t.Errorf("check %d: %+v, want %s", i, c, tc.checks[i].Name)
				}
				if !c.OK && c.Error == "" {
					t.Errorf("failing check %s without its reason", c.Name)
				}
			}
		})
	}
}

// gauge is tollgate_ready{stage}.
func gauge(t *testing.T, reg *prometheus.Registry, stage string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_ready" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == stage {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no tollgate_ready{stage=%q}", stage)
	return 0
}
