// Command createdby deadlocks with goroutines started at two depths, so that the crash
// dump's "created by F in goroutine N" lines can be compared: F is the function whose
// go statement started the goroutine, N the goroutine that ran it.
package main

import "fmt"

var never = make(chan int)

func spawner(started chan<- bool) {
	go func() {
		started <- true
		<-never
	}()
	started <- true
	<-never
}

func main() {
	started := make(chan bool)
	go spawner(started)
	<-started
	<-started
	fmt.Println("main: every goroutine is blocked")
	<-never
}
