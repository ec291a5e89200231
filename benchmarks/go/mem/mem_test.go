// Go's own allocator on the pattern benchmarks/bench_mem.py runs through gosim.mem:
// objects of 64 bytes and 1 KiB allocated in batches of `batch`, each batch dropped
// (garbage) when the next one overwrites it, so the GC frees what gosim frees with
// free_many. One op = one object. Run: GOMAXPROCS=1 go test -bench . -benchmem
package mem

import (
	"syscall"
	"testing"
)

// cpuNow is the CPU time of the process, every thread (the GC's workers included).
func cpuNow() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// reportCPU reports the process's CPU time per op since start as "cpu-ns/op", beside
// testing.B's wall-clock ns/op, as benchmarks/go/core does.
func reportCPU(b *testing.B, start int64) {
	b.ReportMetric(float64(cpuNow()-start)/float64(b.N), "cpu-ns/op")
}

const batch = 100_000

var keep64 = make([]*[64]byte, batch)
var keep1k = make([]*[1024]byte, batch)

func BenchmarkNew64(b *testing.B) {
	b.ReportAllocs()
	defer reportCPU(b, cpuNow())
	for i := 0; i < b.N; i++ {
		keep64[i%batch] = new([64]byte)
	}
}

func BenchmarkNew1K(b *testing.B) {
	b.ReportAllocs()
	defer reportCPU(b, cpuNow())
	for i := 0; i < b.N; i++ {
		keep1k[i%batch] = new([1024]byte)
	}
}
