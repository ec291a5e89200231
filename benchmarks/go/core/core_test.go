package core

import "testing"

// TestWorkloads checks every workload's answer, so a benchmark cannot report the
// speed of a program that lost values.
func TestWorkloads(t *testing.T) {
	const n = 5000
	if got := SpawnJoin(n); got != n*(n-1) {
		t.Fatalf("SpawnJoin: got %d, want %d", got, n*(n-1))
	}
	p := NewPingPong()
	if got := p.RoundTrips(n); got != n {
		t.Fatalf("RoundTrips: got %d, want %d", got, n)
	}
	p.Close()
	if c, s := Buffered(n); c != n || s != n*(n-1)/2 {
		t.Fatalf("Buffered: got (%d, %d)", c, s)
	}
	r := NewRing()
	if got := r.Hops(n); got != n%RingSize {
		t.Fatalf("Hops: got %d, want %d", got, n%RingSize)
	}
	r.Close()
	if c, s := Select2(n); c != n || s != n*(n-1)/2 {
		t.Fatalf("Select2: got (%d, %d)", c, s)
	}
}

// BenchmarkSpawnJoin: one op = one goroutine spawned and joined. b.N goroutines run
// in waves of at most SpawnWave, each wave spawned then joined, as one Python round is.
func BenchmarkSpawnJoin(b *testing.B) {
	for left := b.N; left > 0; {
		w := left
		if w > SpawnWave {
			w = SpawnWave
		}
		if got := SpawnJoin(w); got != w*(w-1) {
			b.Fatalf("SpawnJoin(%d) = %d", w, got)
		}
		left -= w
	}
}

// BenchmarkPingPong: one op = one round trip over two unbuffered channels.
func BenchmarkPingPong(b *testing.B) {
	p := NewPingPong()
	defer p.Close()
	b.ResetTimer()
	if got := p.RoundTrips(b.N); got != b.N {
		b.Fatalf("RoundTrips(%d) = %d", b.N, got)
	}
	b.StopTimer()
}

// BenchmarkBuffered: one op = one item through a channel of capacity 1024.
func BenchmarkBuffered(b *testing.B) {
	if c, s := Buffered(b.N); c != b.N || s != b.N*(b.N-1)/2 {
		b.Fatalf("Buffered(%d) = (%d, %d)", b.N, c, s)
	}
}

// BenchmarkRing: one op = one hop of the token between neighbouring goroutines.
func BenchmarkRing(b *testing.B) {
	r := NewRing()
	defer r.Close()
	b.ResetTimer()
	if got := r.Hops(b.N); got != b.N%RingSize {
		b.Fatalf("Hops(%d) = %d", b.N, got)
	}
	b.StopTimer()
}

// BenchmarkSelect2: one op = one select that received a value.
func BenchmarkSelect2(b *testing.B) {
	if c, s := Select2(b.N); c != b.N || s != b.N*(b.N-1)/2 {
		b.Fatalf("Select2(%d) = (%d, %d)", b.N, c, s)
	}
}
