// Command nilselect shows the nil-channel rules in select: a case on a nil channel
// (send or receive) never fires; a select whose cases are all nil takes its default; a
// nil case beside a ready one never wins; setting a closed channel's variable to nil is
// how a merge loop turns that case off.
package main

import "fmt"

func main() {
	var nilch chan int

	select {
	case <-nilch:
		fmt.Println("nil recv fired")
	case nilch <- 1:
		fmt.Println("nil send fired")
	default:
		fmt.Println("only nil cases: default taken")
	}

	ready := make(chan int, 1)
	nilWins, readyWins := 0, 0
	for i := 0; i < 1000; i++ {
		ready <- i
		select {
		case <-nilch:
			nilWins++
		case nilch <- i:
			nilWins++
		case <-ready:
			readyWins++
		}
	}
	fmt.Println("nil beside ready: nil won", nilWins, "ready won", readyWins)

	closed := make(chan int)
	close(closed)
	wins := 0
	for i := 0; i < 1000; i++ {
		select {
		case <-nilch:
		case nilch <- i:
		case _, ok := <-closed:
			if !ok {
				wins++
			}
		}
	}
	fmt.Println("nil beside closed: closed won", wins)

	// Merge two producers; a case is disabled by setting its channel to nil on close.
	a, b := make(chan int), make(chan int)
	go func() {
		for i := 1; i <= 50; i++ {
			a <- i
		}
		close(a)
	}()
	go func() {
		for i := 1000; i < 1030; i++ {
			b <- i
		}
		close(b)
	}()
	na, nb, sum, closes := 0, 0, 0, 0
	for a != nil || b != nil {
		select {
		case v, ok := <-a:
			if !ok {
				a = nil
				closes++
				continue
			}
			na++
			sum += v
		case v, ok := <-b:
			if !ok {
				b = nil
				closes++
				continue
			}
			nb++
			sum += v
		}
	}
	fmt.Println("merged: from a", na, "from b", nb, "sum", sum, "closes seen", closes)

	select {
	case <-nilch:
	default:
		fmt.Println("after merge, both nil: default taken")
	}
}
