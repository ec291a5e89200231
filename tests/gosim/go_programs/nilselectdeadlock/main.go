// Command nilselectdeadlock deadlocks with one goroutine in a select whose two cases are
// both on nil channels. Go parks it in selectgo with wait reason "select": only a select
// with no cases at all ("select {}") waits as "select (no cases)".
package main

import (
	"fmt"
	"runtime"
)

func main() {
	runtime.GOMAXPROCS(1)
	started := make(chan bool)
	go func() {
		var recvNil, sendNil chan int
		started <- true
		select {
		case <-recvNil:
		case sendNil <- 1:
		}
	}()
	<-started
	fmt.Println("main: the goroutine waits on nil channels only")
	<-started
}
