// Command syncdeadlock ends in Go's fatal error "all goroutines are asleep - deadlock!"
// with its goroutines blocked in package sync, each in a different way, so the crash
// dump shows sync's wait reasons (Go 1.24 and later name them; older Go says
// "semacquire"): a Mutex held by main; an RWMutex held for writing by main, with a
// reader and a second writer waiting (the writer waits on the RWMutex's inner Mutex);
// an RWMutex read-locked by main with a writer waiting for the reader to leave; a Cond
// nobody signals; a Once whose function never returns, and a second caller; main on a
// WaitGroup.
package main

import (
	"fmt"
	"runtime"
	"sync"
)

func main() {
	runtime.GOMAXPROCS(1)
	var mu sync.Mutex
	var rw, rd sync.RWMutex
	var once sync.Once
	var wg sync.WaitGroup
	cond := sync.NewCond(&sync.Mutex{})
	started := make(chan bool)
	never := make(chan bool)

	mu.Lock()
	rw.Lock()
	rd.RLock()
	go func() { started <- true; mu.Lock() }()
	<-started
	go func() { started <- true; rw.RLock() }()
	<-started
	go func() { started <- true; rw.Lock() }()
	<-started
	go func() { started <- true; rd.Lock() }()
	<-started
	go func() { started <- true; cond.L.Lock(); cond.Wait() }()
	<-started
	go func() { started <- true; once.Do(func() { <-never }) }()
	<-started
	go func() { started <- true; once.Do(func() {}) }()
	<-started
	wg.Add(1)
	fmt.Println("main: every goroutine is blocked; main waits on the group")
	wg.Wait()
}
