// Command mainexit shows that when main returns the program ends, whatever the other
// goroutines are doing: a worker parked in range over a channel nobody closes, a
// goroutine that yields in a loop for ever, and one asleep for an hour. Each has started
// (it said so on started) before main goes on; none of them prints again.
package main

import (
	"fmt"
	"runtime"
	"time"
)

func main() {
	work := make(chan int)
	ack := make(chan bool)
	started := make(chan bool)
	go func() {
		started <- true
		for v := range work {
			fmt.Println("worker got", v)
			ack <- true
		}
		fmt.Println("worker: range ended")
	}()
	go func() {
		started <- true
		for {
			runtime.Gosched()
		}
	}()
	go func() {
		started <- true
		time.Sleep(time.Hour)
		fmt.Println("sleeper woke")
	}()
	for i := 0; i < 3; i++ {
		<-started
	}
	for i := 0; i < 3; i++ {
		work <- i
		<-ack
	}
	fmt.Println("main: returning with", runtime.NumGoroutine(), "goroutines")
}
