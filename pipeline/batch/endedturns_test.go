package batch

import (
	"strconv"
	"testing"
)

// The set of recently ended turns is bounded: past its size the oldest
// are forgotten (and then read from the store again), never a newer one.
func TestEndedTurnsForgetsTheOldestFirst(t *testing.T) {
	s := newEndedTurns(3)
	for i := range 5 {
		s.add("t-"+strconv.Itoa(i), uint64(10+i))
		s.add("t-"+strconv.Itoa(i), 99) // a repeat takes no second slot, nor changes the place
	}
	for i, want := range []bool{false, false, true, true, true} {
		if got := s.has("t-" + strconv.Itoa(i)); got != want {
			t.Errorf("has(t-%d) = %v, want %v", i, got, want)
		}
	}
	if seq, ok := s.seq("t-4"); !ok || seq != 14 {
		t.Errorf("seq(t-4) = %d, %v; want its place 14", seq, ok)
	}
	if len(s.set) != 3 {
		t.Errorf("%d turns held, want 3", len(s.set))
	}
}
