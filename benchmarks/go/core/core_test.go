package core

import (
	"syscall"
	"testing"
)

// cpuNow is the CPU time of the process, every thread (GC workers and sysmon
// included): user + system, from getrusage.
func cpuNow() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// reportCPU reports the process's CPU time per op since start as "cpu-ns/op", beside
// testing.B's wall-clock ns/op: on a loaded machine the wall clock also counts the time
// the process waited for a core, the CPU time does not (issue 30).
func reportCPU(b *testing.B, start int64) {
	b.ReportMetric(float64(cpuNow()-start)/float64(b.N), "cpu-ns/op")
}

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
	start := cpuNow()
	defer reportCPU(b, start)
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
	start := cpuNow()
	if got := p.RoundTrips(b.N); got != b.N {
		b.Fatalf("RoundTrips(%d) = %d", b.N, got)
	}
	b.StopTimer()
	reportCPU(b, start)
}

// BenchmarkBuffered: one op = one item through a channel of capacity 1024.
func BenchmarkBuffered(b *testing.B) {
	start := cpuNow()
	defer reportCPU(b, start)
	if c, s := Buffered(b.N); c != b.N || s != b.N*(b.N-1)/2 {
		b.Fatalf("Buffered(%d) = (%d, %d)", b.N, c, s)
	}
}

// BenchmarkRing: one op = one hop of the token between neighbouring goroutines.
func BenchmarkRing(b *testing.B) {
	r := NewRing()
	defer r.Close()
	b.ResetTimer()
	start := cpuNow()
	if got := r.Hops(b.N); got != b.N%RingSize {
		b.Fatalf("Hops(%d) = %d", b.N, got)
	}
	b.StopTimer()
	reportCPU(b, start)
}

// BenchmarkSelect2: one op = one select that received a value.
func BenchmarkSelect2(b *testing.B) {
	start := cpuNow()
	defer reportCPU(b, start)
	if c, s := Select2(b.N); c != b.N || s != b.N*(b.N-1)/2 {
		b.Fatalf("Select2(%d) = (%d, %d)", b.N, c, s)
	}
}
