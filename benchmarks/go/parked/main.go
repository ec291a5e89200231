// Parks N goroutines on one channel, reports the process's memory per goroutine,
// then releases them all. Twin of benchmarks/bench_parked.py's gosim workload.
package main

import (
	"encoding/json"
	"flag"
	"os"
	"runtime"
	"sync"
)

func main() {
	n := flag.Int("n", 1000000, "goroutines to park")
	flag.Parse()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	gate := make(chan struct{})
	var started, done sync.WaitGroup
	started.Add(*n)
	done.Add(*n)
	for i := 0; i < *n; i++ {
		go func() {
			started.Done()
			<-gate
			done.Done()
		}()
	}
	started.Wait()
	runtime.ReadMemStats(&after)
	close(gate)
	done.Wait()
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"n":                   *n,
		"bytes_per_goroutine": float64(after.Sys-before.Sys) / float64(*n),
		"sys_bytes":           after.Sys,
	})
}
