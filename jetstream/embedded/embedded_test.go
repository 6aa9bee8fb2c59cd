package embedded_test

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tollgate-dev/tollgate/jetstream/embedded"
	"github.com/tollgate-dev/tollgate/jetstream/jstest"
)

func TestValidateRefusesWhatIsNotLoopbackOrHasNoStore(t *testing.T) {
	cases := []struct {
		name string
		o    embedded.Options
		ok   bool
	}{
		{"loopback with a store", embedded.Options{StoreDir: "x", Host: "127.0.0.1"}, true},
		{"default host with a store", embedded.Options{StoreDir: "x"}, true},
		{"IPv6 loopback", embedded.Options{StoreDir: "x", Host: "::1"}, true},
		{"all interfaces", embedded.Options{StoreDir: "x", Host: "0.0.0.0"}, false},
		{"a private address", embedded.Options{StoreDir: "x", Host: "10.0.0.1"}, false},
		{"no store dir", embedded.Options{Host: "127.0.0.1"}, false},
		{"cluster node on loopback", embedded.Options{StoreDir: "x", ServerName: "n1", Cluster: &embedded.Cluster{Name: "c", Port: -1, Routes: []string{"nats-route://127.0.0.1:6222", "nats-route://localhost:6223"}}}, true},
		{"cluster node without a server name", embedded.Options{StoreDir: "x", Cluster: &embedded.Cluster{Name: "c", Port: -1}}, false},
		{"cluster without a name", embedded.Options{StoreDir: "x", ServerName: "n1", Cluster: &embedded.Cluster{Port: -1}}, false},
		{"a negative ready timeout", embedded.Options{StoreDir: "x", ReadyTimeout: -time.Second}, false},
		{"a ready timeout of its own", embedded.Options{StoreDir: "x", ReadyTimeout: time.Minute}, true},
		{"a route off loopback", embedded.Options{StoreDir: "x", ServerName: "n1", Cluster: &embedded.Cluster{Name: "c", Port: -1, Routes: []string{"nats-route://10.0.0.2:6222"}}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.o.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestStartServesJetStreamOnLoopbackWithTheRequestedSync(t *testing.T) {
	for _, sync := range []bool{false, true} {
		ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, SyncAlways: sync, ReadyTimeout: jstest.Ready()})
		if err != nil {
			t.Fatal(err)
		}
		opts := ns.JetStreamConfig()
		if opts == nil || opts.SyncAlways != sync {
			ns.Shutdown()
			t.Fatalf("JetStream config %+v, want SyncAlways=%v", opts, sync)
		}
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			ns.Shutdown()
			t.Fatal(err)
		}
		if addr := ns.Addr().String(); !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Errorf("listening on %s, want 127.0.0.1", addr)
		}
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
	}
}

// Start waits ReadyTimeout, not a fixed time, for the server to accept
// clients, and says how long it waited when the server was not ready: a
// server cannot recover JetStream and open its listener within a
// nanosecond, and can within a minute.
func TestStartWaitsTheReadyTimeoutItIsGiven(t *testing.T) {
	_, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, ReadyTimeout: time.Nanosecond})
	if err == nil || !strings.Contains(err.Error(), "not ready within 1ns") {
		t.Fatalf("Start with a 1ns ready timeout: %v, want not ready within 1ns", err)
	}
	ns, err := embedded.Start(embedded.Options{StoreDir: t.TempDir(), Port: -1, ReadyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
}

// The documented production configuration really sets what the docs say.
func TestDeployConfigSyncsEveryWrite(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	conf := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "nats", "single.conf")
	o, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if !o.JetStream || !o.SyncAlways {
		t.Fatalf("%s: jetstream=%v sync_always=%v, want both", conf, o.JetStream, o.SyncAlways)
	}
	if o.Host != "127.0.0.1" {
		t.Fatalf("%s listens on %q, want loopback", conf, o.Host)
	}
}
