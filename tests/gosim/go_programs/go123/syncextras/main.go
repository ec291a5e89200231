// Command syncextras shows Go 1.21's sync.OnceValue and sync.OnceFunc (one call of f,
// its value for every caller, a panic re-raised on every call) and Go 1.23's And and
// Or methods of the atomic integers (the old value returned, the mask applied).
package main

import (
	"fmt"
	"sync"
	"sync/atomic"
)

func main() {
	calls := 0
	get := sync.OnceValue(func() int {
		calls++
		return 42
	})
	var wg sync.WaitGroup
	results := make([]int, 3)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = get()
		}()
	}
	wg.Wait()
	fmt.Println("OnceValue results:", results, get(), "calls:", calls)

	failures := 0
	f := sync.OnceFunc(func() {
		failures++
		panic("once")
	})
	for i := 0; i < 2; i++ {
		func() {
			defer func() { fmt.Println("OnceFunc call", i, "panicked with:", recover()) }()
			f()
		}()
	}
	fmt.Println("OnceFunc ran f", failures, "time(s)")

	var i32 atomic.Int32
	i32.Store(-6)
	fmt.Println("Int32(-6).And(3) old:", i32.And(3), "new:", i32.Load())
	fmt.Println("Int32(2).Or(-8) old:", i32.Or(-8), "new:", i32.Load())
	var u32 atomic.Uint32
	u32.Store(0xff)
	fmt.Println("Uint32(255).And(^uint32(1)) old:", u32.And(^uint32(1)), "new:", u32.Load())
	fmt.Println("Uint32(254).Or(1<<31) old:", u32.Or(1<<31), "new:", u32.Load())
	var i64 atomic.Int64
	i64.Store(1 << 40)
	fmt.Println("Int64(1<<40).Or(1) old:", i64.Or(1), "new:", i64.Load())
	var u64 atomic.Uint64
	u64.Store(^uint64(0))
	fmt.Println("Uint64(max).And(1<<63) old:", u64.And(1<<63), "new:", u64.Load())
}
