// Two goroutines contend for one sync.Mutex, each holding it for a while per
// acquisition. Go's Mutex switches to starvation mode when a waiter has waited more
// than 1 ms and back to normal mode when the waiter it hands the lock to is the last
// one: neither goroutine starves, and neither mode sticks. The program prints verdicts
// on the order of acquisitions (real time makes the exact counts vary between runs).
package main

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// hold keeps the lock for d without parking, so that timing is that of the lock alone.
func hold(d time.Duration) {
	t0 := time.Now()
	for time.Since(t0) < d {
	}
}

// contend runs two goroutines that take the mutex total times between them and returns
// who took it each time (0 or 1).
func contend(d time.Duration, total int) []int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	order := make([]int, 0, total)
	for id := 0; id < 2; id++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			for {
				mu.Lock()
				if len(order) == total {
					mu.Unlock()
					return
				}
				order = append(order, id)
				hold(d)
				mu.Unlock()
			}
		}(id)
	}
	wg.Wait()
	return order
}

// runs returns the lengths of the maximal stretches of equal entries.
func runs(order []int) []int {
	var out []int
	for i := 0; i < len(order); {
		j := i
		for j < len(order) && order[j] == order[i] {
			j++
		}
		out = append(out, j-i)
		i = j
	}
	return out
}

// report prints whether the split is fair and whether the median run (the number of
// acquisitions in a row by one goroutine) lies in [lo, hi].
func report(name string, d time.Duration, total, lo, hi int) {
	order := contend(d, total)
	first := 0
	for _, id := range order {
		if id == 0 {
			first++
		}
	}
	// The first and last runs are cut by the start and the end; the median of the
	// others is robust to the odd run that an OS preemption of the holder stretches.
	rs := runs(order)
	rs = rs[1 : len(rs)-1]
	sort.Ints(rs)
	median := rs[len(rs)/2]
	fmt.Printf("%s: each goroutine gets between 30%% and 70%%: %v\n", name,
		first*10 >= total*3 && first*10 <= total*7)
	fmt.Printf("%s: median run between %d and %d: %v\n", name, lo, hi, median >= lo && median <= hi)
}

func main() {
	// Holds well under 1 ms: normal mode lets the holder re-take the lock until the
	// other has waited 1 ms, starvation mode hands it over once, and the new owner,
	// the last waiter, switches back: runs of about 1 ms / 100 µs.
	report("hold 100us", 100*time.Microsecond, 400, 8, 14)
	// Holds over 1 ms: each handoff is followed by one re-take: runs of 2.
	report("hold 2ms", 2*time.Millisecond, 100, 2, 2)
}
