// Package core is the Go side of benchmarks/bench_core.py: the five core workloads
// (spawn-and-join, unbuffered ping-pong, buffered throughput, ring, 2-channel select)
// written the way a Go programmer would write them, so that gosim and the Python peers
// can be compared with the real thing per operation.
//
// Each workload is split the same way as its Python twin: setup that is not timed
// (goroutines and channels that exist before the measured phase) and a phase that is.
// core_test.go wraps the phases in testing.B benchmarks whose b.N counts single
// operations (one spawn, one round trip, one item, one hop, one select), so the
// ns/op that `go test -bench` prints is directly the per-op figure.
package core

// RingSize is the number of goroutines in the token ring (workload 4); it must match
// RING in benchmarks/bench_core.py.
const RingSize = 1000

// SpawnWave is the largest number of goroutines alive at once in the spawn-and-join
// workload (workload 1): the Python side spawns exactly this many per round.
const SpawnWave = 100000

// SpawnJoin starts n goroutines; each does trivial work (i*2) and signals done by
// sending the result on a channel with room for all of them. It returns once every
// goroutine has signalled, with the sum of their results: n*(n-1).
func SpawnJoin(n int) int {
	done := make(chan int, n)
	for i := 0; i < n; i++ {
		go func(i int) { done <- i * 2 }(i)
	}
	total := 0
	for i := 0; i < n; i++ {
		total += <-done
	}
	return total
}

// PingPong is two goroutines joined by two unbuffered channels: the caller sends on
// ping, the ponger answers v+1 on pong.
type PingPong struct {
	ping chan int
	pong chan int
}

// NewPingPong starts the ponger; Close stops it.
func NewPingPong() *PingPong {
	p := &PingPong{ping: make(chan int), pong: make(chan int)}
	go func() {
		for v := range p.ping {
			p.pong <- v + 1
		}
	}()
	return p
}

// RoundTrips does n round trips, each carrying the previous answer, so it returns n.
func (p *PingPong) RoundTrips(n int) int {
	v := 0
	for i := 0; i < n; i++ {
		p.ping <- v
		v = <-p.pong
	}
	return v
}

// Close ends the ponger's range loop.
func (p *PingPong) Close() { close(p.ping) }

// Buffered sends 0..n-1 from one producer goroutine through a channel of capacity
// 1024 to the caller, which ranges over it. It returns (count, sum).
func Buffered(n int) (int, int) {
	ch := make(chan int, 1024)
	go func() {
		for i := 0; i < n; i++ {
			ch <- i
		}
		close(ch)
	}()
	count, total := 0, 0
	for v := range ch {
		count++
		total += v
	}
	return count, total
}

// Ring is RingSize goroutines, node i receiving on chans[i] and sending on
// chans[(i+1)%RingSize], all unbuffered. The token is the number of hops left;
// the node that receives 0 reports its index on done.
type Ring struct {
	chans []chan int
	done  chan int
}

// NewRing starts the nodes; Close stops them.
func NewRing() *Ring {
	r := &Ring{chans: make([]chan int, RingSize), done: make(chan int, 1)}
	for i := range r.chans {
		r.chans[i] = make(chan int)
	}
	for i := 0; i < RingSize; i++ {
		go func(idx int, in <-chan int, out chan<- int) {
			for v := range in {
				if v == 0 {
					r.done <- idx
				} else {
					out <- v - 1
				}
			}
		}(i, r.chans[i], r.chans[(i+1)%RingSize])
	}
	return r
}

// Hops injects a token at node 0 that travels n hops, and returns the index of the
// node where it stopped: n % RingSize.
func (r *Ring) Hops(n int) int {
	r.chans[0] <- n
	return <-r.done
}

// Close closes every ring channel, so every node's range loop ends.
func (r *Ring) Close() {
	for _, c := range r.chans {
		close(c)
	}
}

// Select2 feeds two unbuffered channels from two producers (0..n/2-1 on a,
// n/2..n-1 on b, then close) and drains both with one select loop, turning a channel
// to nil once it is closed as Go code does. It returns (count, sum) over the values.
func Select2(n int) (int, int) {
	a, b := make(chan int), make(chan int)
	half := n / 2
	produce := func(ch chan<- int, lo, hi int) {
		for i := lo; i < hi; i++ {
			ch <- i
		}
		close(ch)
	}
	go produce(a, 0, half)
	go produce(b, half, n)
	count, total := 0, 0
	for a != nil || b != nil {
		select {
		case v, ok := <-a:
			if !ok {
				a = nil
				continue
			}
			count++
			total += v
		case v, ok := <-b:
			if !ok {
				b = nil
				continue
			}
			count++
			total += v
		}
	}
	return count, total
}
