// Command wgnegative shows what a WaitGroup holds after its negative-counter panic was
// recovered: Go has already stored the counter (-1) when it panics, so Add(1) brings it
// back to zero and Wait returns at once.
package main

import (
	"fmt"
	"sync"
)

func main() {
	var wg sync.WaitGroup
	func() {
		defer func() { fmt.Println("recovered:", recover()) }()
		wg.Add(-1)
	}()
	wg.Add(1)
	wg.Wait()
	fmt.Println("wait returned after Add(1)")
}
