// Command deadlock ends in Go's fatal error "all goroutines are asleep - deadlock!". Its
// goroutines block in different ways so the crash dump shows each wait reason: main on a
// receive, one on an unbuffered send, one on a send to a full buffered channel, one in
// range over a channel nobody closes, one in a select with a send and a receive case,
// and one in an empty select.
package main

import (
	"fmt"
	"runtime"
)

func main() {
	runtime.GOMAXPROCS(1)
	unbuf := make(chan int)
	full := make(chan int, 1)
	full <- 0
	open := make(chan int)
	a, b := make(chan int), make(chan int)
	started := make(chan bool)

	go func() {
		started <- true
		unbuf <- 1
	}()
	<-started
	go func() {
		started <- true
		full <- 1
	}()
	<-started
	go func() {
		started <- true
		for range open {
		}
	}()
	<-started
	go func() {
		started <- true
		select {
		case <-a:
		case b <- 1:
		}
	}()
	<-started
	go func() {
		started <- true
		select {}
	}()
	<-started
	fmt.Println("main: every goroutine is blocked; main blocks too")
	<-a
}
