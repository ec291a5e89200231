// Command fifo shows that a channel serves blocked goroutines in arrival order: senders
// parked on a full (or unbuffered) channel deliver their values in the order they parked,
// after the buffered values, and receivers parked on an empty channel get values in the
// order they parked. Odd-numbered goroutines wait inside a select (with a nil case), even
// ones in a plain operation: both kinds share one queue.
//
// Determinism: with GOMAXPROCS(1), a goroutine that hands a value to the parked main
// goroutine keeps running until it parks itself, so once main has received a goroutine's
// "started" message that goroutine is already parked on ch. settle yields a few times
// besides, for the rare run where main was preempted before it parked.
package main

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
)

const waiters = 20

func send(id int, ch chan int, started chan<- int) {
	started <- id
	if id%2 == 1 {
		var never chan int
		select {
		case ch <- id:
		case <-never:
		}
		return
	}
	ch <- id
}

func receive(id int, ch chan int, started chan<- int, got chan<- [2]int) {
	started <- id
	var v int
	if id%2 == 1 {
		var never chan int
		select {
		case v = <-ch:
		case never <- 0:
		}
	} else {
		v = <-ch
	}
	got <- [2]int{id, v}
}

// settle yields the processor a few times so that a goroutine that has just signalled
// main reaches the channel operation it parks on, even if main was preempted first.
func settle() {
	for i := 0; i < 3; i++ {
		runtime.Gosched()
	}
}

func join(vs []int) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, " ")
}

func blockedSenders(capacity int) {
	ch := make(chan int, capacity)
	for i := 0; i < capacity; i++ {
		ch <- 100 + i
	}
	started := make(chan int)
	for id := 0; id < waiters; id++ {
		go send(id, ch, started)
		<-started
		settle()
	}
	var order []int
	for i := 0; i < capacity+waiters; i++ {
		order = append(order, <-ch)
	}
	fmt.Printf("senders cap=%d: %s\n", capacity, join(order))
}

func blockedReceivers(capacity int) {
	ch := make(chan int, capacity)
	started := make(chan int)
	got := make(chan [2]int, waiters)
	for id := 0; id < waiters; id++ {
		go receive(id, ch, started, got)
		<-started
		settle()
	}
	for v := 0; v < waiters; v++ {
		ch <- v
	}
	byReceiver := make([]int, waiters)
	for i := 0; i < waiters; i++ {
		r := <-got
		byReceiver[r[0]] = r[1]
	}
	fmt.Printf("receivers cap=%d: %s\n", capacity, join(byReceiver))
}

func main() {
	runtime.GOMAXPROCS(1)
	for _, capacity := range []int{0, 1, 5} {
		blockedSenders(capacity)
		blockedReceivers(capacity)
	}
}
