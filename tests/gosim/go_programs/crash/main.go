// Command crash dies of the misuse its argument names, without recovering, so that the
// first line of the crash report can be compared: Go prints a runtime panic's message
// after "panic: " and a fatal error (throw) as "fatal error: ...".
package main

import (
	"fmt"
	"os"
	"sync"
)

func main() {
	fmt.Println("main: about to crash:", os.Args[1])
	switch os.Args[1] {
	case "sendclosed":
		ch := make(chan int, 1)
		close(ch)
		ch <- 1
	case "closeclosed":
		ch := make(chan int)
		close(ch)
		close(ch)
	case "negwaitgroup":
		var wg sync.WaitGroup
		wg.Done()
	case "unlock":
		var mu sync.Mutex
		mu.Unlock()
	}
}
