// Command panic shows that a recovered panic is local to its goroutine while an
// unrecovered one ends the whole program: the panicking goroutine's deferred calls run,
// then the program exits with status 2 and "panic: boom" on stderr, and main never
// prints again.
package main

import (
	"errors"
	"fmt"
	"runtime"
)

func main() {
	runtime.GOMAXPROCS(1)
	fmt.Println("main: start")
	done := make(chan bool)
	go func() {
		defer func() {
			fmt.Println("first: recovered", recover())
			done <- true
		}()
		panic(errors.New("handled"))
	}()
	<-done
	fmt.Println("main: the recovered panic did not stop the program")

	block := make(chan bool)
	go func() {
		defer fmt.Println("second: deferred call runs while panicking")
		fmt.Println("second: about to panic")
		panic(errors.New("boom"))
	}()
	<-block
	fmt.Println("main: unreachable")
}
