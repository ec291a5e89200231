// Command closed exercises Go's rules for closed channels: a receive drains the buffer
// and then returns the zero value with ok false, for ever; a send panics "send on closed
// channel", also for a sender already parked when the channel is closed; a second close
// panics "close of closed channel"; closing a nil channel panics "close of nil channel";
// close wakes parked receivers (plain and in select) with the zero value; a select
// receive case on a closed channel is always ready; range stops at close.
//
// Every line is deterministic: each outcome is the same whichever goroutine runs first.
package main

import (
	"fmt"
	"runtime"
	"sort"
)

// try runs f and prints the value it panics with, recovered as a deferred call would.
func try(what string, f func()) {
	defer func() {
		fmt.Printf("%s: recovered %v\n", what, recover())
	}()
	f()
}

func main() {
	runtime.GOMAXPROCS(1)
	var never chan int

	ch := make(chan int, 3)
	ch <- 1
	ch <- 2
	close(ch)
	fmt.Println("closed buffered chan: len", len(ch), "cap", cap(ch))
	for i := 0; i < 4; i++ {
		v, ok := <-ch
		fmt.Println("recv", v, ok)
	}
	fmt.Println("plain recv after drain:", <-ch)
	fmt.Println("len after drain:", len(ch))

	try("send on closed", func() { ch <- 3 })
	try("close of closed", func() { close(ch) })
	var nilch chan int
	try("close of nil", func() { close(nilch) })
	try("select send on closed", func() {
		select {
		case ch <- 4:
		case <-never:
		}
	})

	select {
	case v, ok := <-ch:
		fmt.Println("select recv on closed:", v, ok)
	case <-never:
		fmt.Println("nil case fired")
	}

	// Parked receivers, plain and in select, and a parked sender, then close.
	u := make(chan int)
	results := make(chan string, 4)
	started := make(chan bool)
	for i := 0; i < 2; i++ {
		go func() {
			started <- true
			v, ok := <-u
			results <- fmt.Sprint("parked receiver woke: ", v, " ", ok)
		}()
		<-started
	}
	go func() {
		started <- true
		select {
		case v, ok := <-u:
			results <- fmt.Sprint("parked select receiver woke: ", v, " ", ok)
		case <-never:
		}
	}()
	<-started
	close(u)
	lines := []string{<-results, <-results, <-results}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}

	full := make(chan int, 1)
	full <- 0
	go func() {
		defer func() { results <- fmt.Sprint("parked sender: recovered ", recover()) }()
		started <- true
		full <- 1
	}()
	<-started
	close(full)
	fmt.Println(<-results)
	v, ok := <-full
	fmt.Println("buffered value survives close:", v, ok)
	v, ok = <-full
	fmt.Println("then:", v, ok)

	// for v := range ch ends when the channel is closed and drained.
	nums := make(chan int, 2)
	go func() {
		for i := 0; i < 5; i++ {
			nums <- i * i
		}
		close(nums)
	}()
	for v := range nums {
		fmt.Println("range got", v)
	}
	fmt.Println("range ended")
}
