package embedded

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortIsOutsideTheEphemeralRange: the port can be listened on, and
// where the kernel names its ephemeral range it lies below it, so that no
// outgoing connection's local port can take it before its listener starts.
func TestFreePortIsOutsideTheEphemeralRange(t *testing.T) {
	lo, known := ephemeralLow()
	seen := map[int]bool{}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if known && (port < minFreePort || port >= lo) {
			t.Fatalf("port %d, want one in [%d, %d), below the ephemeral range", port, minFreePort, lo)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("FreePort gave %d, which cannot be listened on: %v", port, err)
		}
		ln.Close()
		seen[port] = true
	}
	if len(seen) < 15 {
		t.Fatalf("20 calls gave only %d distinct ports: %v", len(seen), seen)
	}
}
