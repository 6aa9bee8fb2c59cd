package topology_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
)

// turnLogConfig is the turn-log stream i as it is on the server.
func turnLogConfig(t *testing.T, ctx context.Context, js jetstream.JetStream, i int) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(ctx, topology.TurnLogStream(i))
	if err != nil {
		t.Fatalf("stream %s: %v", topology.TurnLogStream(i), err)
	}
	return s.CachedInfo().Config
}

// allStreams is every stream on the server, by name, with its
// configuration and message count.
func allStreams(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]jetstream.StreamInfo {
	t.Helper()
	out := map[string]jetstream.StreamInfo{}
	for _, name := range streamNames(t, ctx, js) {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		out[name] = jetstream.StreamInfo{Config: info.Config, State: jetstream.StreamState{Msgs: info.State.Msgs}}
	}
	return out
}

// Ensure makes one turn-log stream per partition, each on its own subjects,
// with the topology's limits, direct gets on one replica, and the number
// of partitions in its metadata.
func TestEnsureCreatesTheTurnLogs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions int // the configuration's
		want       int // streams made
	}{
		{"the default number of partitions", 0, topology.DefaultTurnLogPartitions},
		{"two partitions", 2, 2},
		{"one partition", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, js, ctx := bare(t)
			cfg := topology.DefaultConfig()
			cfg.TurnLogPartitions = tc.partitions
			if err := topology.Ensure(ctx, js, cfg); err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				c := turnLogConfig(t, ctx, js, i)
				if want := "tollgate.turnlog." + strconv.Itoa(i) + ".>"; !slices.Equal(c.Subjects, []string{want}) {
					t.Errorf("%s subjects %v, want [%s]", c.Name, c.Subjects, want)
				}
				if got := c.Metadata[topology.MetaTurnLogPartitions]; got != strconv.Itoa(tc.want) {
					t.Errorf("%s metadata %s = %q, want %d", c.Name, topology.MetaTurnLogPartitions, got, tc.want)
				}
				if !c.AllowDirect || c.MaxAge != cfg.MaxAge || c.Duplicates != cfg.DuplicateWindow || c.Replicas != 1 || c.Retention != jetstream.LimitsPolicy {
					t.Errorf("%s: direct %v, max age %v, duplicates %v, replicas %d, retention %v", c.Name, c.AllowDirect, c.MaxAge, c.Duplicates, c.Replicas, c.Retention)
				}
			}
			if _, err := js.Stream(ctx, topology.TurnLogStream(tc.want)); !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Errorf("stream %s: %v, want none", topology.TurnLogStream(tc.want), err)
			}
			if changes, err := topology.Plan(ctx, js, cfg, nil); err != nil || len(changes) != 0 {
				t.Errorf("Plan after Ensure: %v, %v; want nothing", changes, err)
			}
		})
	}
}

// A second Ensure asking for another number of partitions than the
// server's turn logs record is refused with ErrTurnLogPartitions (the
// partition of a turn is its id's hash modulo their number) before it
// writes anything: no stream is created, deleted or changed, not even a
// setting of the rest of the topology that differs too, and what the logs
// hold stays. The same number, given explicitly, is accepted.
func TestEnsureRefusesAnotherNumberOfPartitions(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig() // 4 partitions
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, topology.TurnLogSubject(1, "t-1", "running"), []byte("batch")); err != nil {
		t.Fatal(err)
	}
	before := allStreams(t, ctx, js)

	for _, tc := range []struct {
		name string
		cfg  func(c *topology.Config)
	}{
		{"fewer partitions", func(c *topology.Config) { c.TurnLogPartitions = 2 }},
		{"more partitions", func(c *topology.Config) { c.TurnLogPartitions = 6 }},
		{"more partitions and a longer max age", func(c *topology.Config) {
			c.TurnLogPartitions = 6
			c.MaxAge = 2 * c.MaxAge
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := cfg
			tc.cfg(&other)
			err := topology.Ensure(ctx, js, other)
			if !errors.Is(err, topology.ErrTurnLogPartitions) {
				t.Fatalf("Ensure with %d partitions over 4: %v, want ErrTurnLogPartitions", other.TurnLogPartitions, err)
			}
			if !strings.Contains(err.Error(), `"4"`) {
				t.Errorf("the error does not say what the server has: %v", err)
			}
			after := allStreams(t, ctx, js)
			if !reflect.DeepEqual(before, after) {
				t.Errorf("a refused Ensure changed the streams\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}

	t.Run("the same number given explicitly", func(t *testing.T) {
		same := cfg
		same.TurnLogPartitions = topology.DefaultTurnLogPartitions
		if err := topology.Ensure(ctx, js, same); err != nil {
			t.Fatalf("Ensure with the server's number of partitions: %v", err)
		}
		if after := allStreams(t, ctx, js); !reflect.DeepEqual(before, after) {
			t.Errorf("Ensure over a matching topology changed the streams\nbefore %+v\nafter  %+v", before, after)
		}
	})

	t.Run("a turn log 0 that records no number", func(t *testing.T) {
		_, js, ctx := bare(t)
		sc := cfg.TurnLogStreams()[0]
		sc.Metadata = nil
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		if err := topology.Ensure(ctx, js, cfg); !errors.Is(err, topology.ErrTurnLogPartitions) {
			t.Fatalf("Ensure over a turn log without the number: %v, want ErrTurnLogPartitions", err)
		}
		if names := streamNames(t, ctx, js); !slices.Equal(names, []string{topology.TurnLogStream(0)}) {
			t.Errorf("streams after the refused Ensure: %v, want only %s", names, topology.TurnLogStream(0))
		}
	})
}

// OpenTurnLogs (and OpenBuckets) bind as many turn logs as the server's
// record, whatever the caller's configuration says: every process must
// find a turn in the same partition.
func TestOpenTurnLogsOpensTheNumberOnTheServer(t *testing.T) {
	t.Run("before Ensure it fails with ErrStreamNotFound", func(t *testing.T) {
		_, js, ctx := bare(t)
		if logs, err := topology.OpenTurnLogs(ctx, js); !errors.Is(err, jetstream.ErrStreamNotFound) || logs != nil {
			t.Fatalf("OpenTurnLogs on an empty server: %v, %v; want ErrStreamNotFound", logs, err)
		}
	})

	_, js, ctx := bare(t)
	three := topology.DefaultConfig()
	three.TurnLogPartitions = 3
	if err := topology.Ensure(ctx, js, three); err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, logs []jetstream.Stream) {
		t.Helper()
		if len(logs) != 3 {
			t.Fatalf("%d turn logs opened, want the server's 3 (the default configuration says %d)", len(logs), topology.DefaultTurnLogPartitions)
		}
		for i, s := range logs {
			if name := s.CachedInfo().Config.Name; name != topology.TurnLogStream(i) {
				t.Errorf("turn log %d is %s, want %s", i, name, topology.TurnLogStream(i))
			}
		}
	}
	t.Run("the number recorded on the server", func(t *testing.T) {
		logs, err := topology.OpenTurnLogs(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		check(t, logs)
		b, err := topology.OpenBuckets(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		check(t, b.TurnLogs)
	})
	t.Run("a stream the number names is missing", func(t *testing.T) {
		_, js, ctx := bare(t)
		if err := topology.Ensure(ctx, js, three); err != nil {
			t.Fatal(err)
		}
		if err := js.DeleteStream(ctx, topology.TurnLogStream(2)); err != nil {
			t.Fatal(err)
		}
		if _, err := topology.OpenTurnLogs(ctx, js); !errors.Is(err, jetstream.ErrStreamNotFound) || !strings.Contains(err.Error(), topology.TurnLogStream(2)) {
			t.Fatalf("OpenTurnLogs without %s: %v, want ErrStreamNotFound naming it", topology.TurnLogStream(2), err)
		}
	})
	for _, meta := range []string{"", "zero", "0", strconv.Itoa(topology.MaxTurnLogPartitions + 1)} {
		t.Run("a number that is not one: "+strconv.Quote(meta), func(t *testing.T) {
			_, js, ctx := bare(t)
			sc := three.TurnLogStreams()[0]
			sc.Metadata = map[string]string{topology.MetaTurnLogPartitions: meta}
			if meta == "" {
				sc.Metadata = nil
			}
			if _, err := js.CreateStream(ctx, sc); err != nil {
				t.Fatal(err)
			}
			if logs, err := topology.OpenTurnLogs(ctx, js); !errors.Is(err, topology.ErrTurnLogPartitions) || logs != nil {
				t.Fatalf("OpenTurnLogs: %d logs, %v; want ErrTurnLogPartitions", len(logs), err)
			}
		})
	}
}

// Check (a stage with --no-provision) names a turn log that is missing and
// one whose direct gets or recorded number of partitions differ; Ensure
// converges them, keeping what they hold.
func TestCheckNamesTurnLogsThatDiffer(t *testing.T) {
	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if err := topology.Check(ctx, js, cfg, nil); err != nil {
		t.Fatalf("Check after Ensure: %v", err)
	}
	if _, err := js.Publish(ctx, topology.TurnLogSubject(1, "t-1", "running"), []byte("batch")); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, topology.TurnLogStream(2)); err != nil {
		t.Fatal(err)
	}
	direct := cfg.TurnLogStreams()[1]
	direct.AllowDirect = false
	if _, err := js.UpdateStream(ctx, direct); err != nil {
		t.Fatal(err)
	}
	meta := cfg.TurnLogStreams()[3]
	meta.Metadata = map[string]string{topology.MetaTurnLogPartitions: "5"}
	if _, err := js.UpdateStream(ctx, meta); err != nil {
		t.Fatal(err)
	}

	changes, err := topology.Plan(ctx, js, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"stream TOLLGATE_TURNLOG_1: allow_direct false, want true",
		"stream TOLLGATE_TURNLOG_2: missing",
		"stream TOLLGATE_TURNLOG_3: metadata.tollgate_turnlog_partitions 5, want 4",
	}
	var got []string
	for _, c := range changes {
		if c.Kind != topology.KindStream {
			t.Errorf("change %s of kind %q, want %q", c, c.Kind, topology.KindStream)
		}
		got = append(got, c.String())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	ensureMends(t, ctx, js, cfg, want)
	if c := turnLogConfig(t, ctx, js, 1); !c.AllowDirect {
		t.Errorf("%s: direct gets still off", c.Name)
	}
	s, err := js.Stream(ctx, topology.TurnLogStream(1))
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%s holds %d messages after Ensure, want the 1 it held", topology.TurnLogStream(1), n)
	}
}

// On three replicas the turn logs turn direct gets off, as the buckets do
// (a follower could answer with an event older than an acknowledged
// append), and Check names a replicated turn log that allows them.
func TestTurnLogsOfAReplicatedTopologyAllowNoDirectGets(t *testing.T) {
	cfg := topology.DefaultConfig()
	cfg.Replicas = 3
	for _, sc := range cfg.TurnLogStreams() {
		if sc.AllowDirect || sc.Replicas != 3 {
			t.Errorf("%s: direct %v, replicas %d; want false, 3", sc.Name, sc.AllowDirect, sc.Replicas)
		}
	}
	// A single-replica log compared with the replicated configuration.
	one := topology.DefaultConfig().TurnLogStreams()[0]
	_, js, ctx := bare(t)
	if _, err := js.CreateStream(ctx, one); err != nil {
		t.Fatal(err)
	}
	changes, err := topology.Plan(ctx, js, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range changes {
		if c.Name != topology.TurnLogStream(0) {
			continue
		}
		want := "stream TOLLGATE_TURNLOG_0: replicas 1, want 3; allow_direct true, want false"
		if c.String() != want {
			t.Fatalf("Plan: %s, want %s", c, want)
		}
		return
	}
	t.Fatalf("Plan does not name %s: %v", topology.TurnLogStream(0), changes)
}

// ParseTurnLogSubject reads back what TurnLogSubject writes, and nothing
// else.
func TestParseTurnLogSubject(t *testing.T) {
	for _, tc := range []struct {
		name, subject string
		ok            bool
		i             int
		turn, event   string
	}{
		{"an event of a turn", topology.TurnLogSubject(3, "t-1", "running"), true, 3, "t-1", "running"},
		{"partition 0", topology.TurnLogSubject(0, "t-2", "completed"), true, 0, "t-2", "completed"},
		{"another prefix", "tollgate.event.turn.outcome.t-1", false, 0, "", ""},
		{"a partition that is not a number", "tollgate.turnlog.x.t-1.running", false, 0, "", ""},
		{"a negative partition", "tollgate.turnlog.-1.t-1.running", false, 0, "", ""},
		{"no event", "tollgate.turnlog.1.t-1", false, 0, "", ""},
		{"an empty event", "tollgate.turnlog.1.t-1.", false, 0, "", ""},
		{"an empty turn", "tollgate.turnlog.1..running", false, 0, "", ""},
		{"a token too many", "tollgate.turnlog.1.t-1.running.x", false, 0, "", ""},
		{"a partition with a leading zero", "tollgate.turnlog.01.t-1.running", false, 0, "", ""},
		{"the wildcard of a turn", topology.TurnLogWildcard(1, "t-1"), false, 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i, turn, event, ok := topology.ParseTurnLogSubject(tc.subject)
			if ok != tc.ok || i != tc.i || turn != tc.turn || event != tc.event {
				t.Fatalf("ParseTurnLogSubject(%q) = %d %q %q %v, want %d %q %q %v", tc.subject, i, turn, event, ok, tc.i, tc.turn, tc.event, tc.ok)
			}
		})
	}
}

func FuzzParseTurnLogSubject(f *testing.F) {
	f.Add(topology.TurnLogSubject(2, "t-abc", "awaiting"))
	f.Add("tollgate.turnlog.1..x")
	f.Fuzz(func(t *testing.T, subject string) {
		i, turn, event, ok := topology.ParseTurnLogSubject(subject)
		if ok && topology.TurnLogSubject(i, turn, event) != subject {
			t.Fatalf("%q parsed as %d %q %q, which writes back as another subject", subject, i, turn, event)
		}
	})
}

// TestTheTurnStreamsAllowDirectGetsOnOneReplica: TOLLGATE_TURNS and
// TOLLGATE_INBOUND, read by message get on every turn, allow direct gets
// where the buckets do (one replica) and not on three; a deployment
// provisioned before (no direct gets) is reported by Check and updated in
// place by Ensure, its messages kept.
func TestTheTurnStreamsAllowDirectGetsOnOneReplica(t *testing.T) {
	for _, replicas := range []int{1, 3} {
		cfg := topology.DefaultConfig()
		cfg.Replicas = replicas
		for _, sc := range cfg.Streams() {
			want := replicas == 1 && (sc.Name == topology.StreamTurns || sc.Name == topology.StreamInbound)
			if sc.AllowDirect != want {
				t.Errorf("replicas %d: %s allows direct gets: %v, want %v", replicas, sc.Name, sc.AllowDirect, want)
			}
		}
	}

	_, js, ctx := bare(t)
	cfg := topology.DefaultConfig()
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, topology.OrderSubject(topology.OrderExec, "s-1"), []byte("an entry")); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, sc := range cfg.Streams() {
		if !sc.AllowDirect {
			continue
		}
		sc.AllowDirect = false // as an earlier version provisioned it
		if _, err := js.UpdateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		want = append(want, "stream "+sc.Name+": allow_direct false, want true")
	}
	ensureMends(t, ctx, js, cfg, want)
	s, err := js.Stream(ctx, topology.StreamTurns)
	if err != nil {
		t.Fatal(err)
	}
	if info := s.CachedInfo(); !info.Config.AllowDirect || info.State.Msgs != 1 {
		t.Errorf("%s after Ensure: direct %v, %d messages; want direct gets on and the 1 message it held", topology.StreamTurns, info.Config.AllowDirect, info.State.Msgs)
	}
}

// ensureMends fails unless Check refuses cfg (ErrNotProvisioned) naming
// each difference in want, and Check passes once Ensure has run.
func ensureMends(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg topology.Config, want []string) {
	t.Helper()
	err := topology.Check(ctx, js, cfg, nil)
	if !errors.Is(err, topology.ErrNotProvisioned) {
		t.Fatalf("Check: %v, want ErrNotProvisioned", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Check's error does not name %q: %v", w, err)
		}
	}
	if err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("Ensure over the differing streams: %v", err)
	}
	if err := topology.Check(ctx, js, cfg, nil); err != nil {
		t.Fatalf("Check after Ensure: %v", err)
	}
}
