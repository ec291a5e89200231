// Command selectdefault shows select with a default case as Go's non-blocking channel
// operations: a receive from an empty channel and a send to a full one take the default;
// a send on an unbuffered channel succeeds only when a receiver is already parked; a
// closed channel's receive case is ready, so default is not taken; ready cases always
// beat default; a one-slot channel used as a try-lock.
//
// Determinism: GOMAXPROCS(1), so a goroutine that signals main is parked on its next
// channel operation by the time main runs; settle yields a few times besides (see fifo).
package main

import (
	"fmt"
	"runtime"
)

func settle() {
	for i := 0; i < 3; i++ {
		runtime.Gosched()
	}
}

func tryRecv(ch chan int) string {
	select {
	case v, ok := <-ch:
		return fmt.Sprint("received ", v, " ", ok)
	default:
		return "would block"
	}
}

func trySend(ch chan int, v int) string {
	select {
	case ch <- v:
		return fmt.Sprint("sent ", v)
	default:
		return fmt.Sprint("dropped ", v)
	}
}

func main() {
	runtime.GOMAXPROCS(1)

	buf := make(chan int, 2)
	fmt.Println("empty buffered:", tryRecv(buf))
	for i := 0; i < 4; i++ {
		fmt.Println("buffered cap 2:", trySend(buf, i))
	}
	fmt.Println("len after non-blocking sends:", len(buf))
	for i := 0; i < 3; i++ {
		fmt.Println("draining:", tryRecv(buf))
	}

	unbuf := make(chan int)
	fmt.Println("unbuffered, nobody waiting:", trySend(unbuf, 7))
	fmt.Println("unbuffered, nobody sending:", tryRecv(unbuf))

	started := make(chan bool)
	got := make(chan int)
	go func() {
		started <- true
		got <- <-unbuf
	}()
	<-started
	settle()
	fmt.Println("unbuffered, receiver parked:", trySend(unbuf, 42))
	fmt.Println("the receiver got", <-got)

	go func() {
		started <- true
		unbuf <- 9
	}()
	<-started
	settle()
	fmt.Println("unbuffered, sender parked:", tryRecv(unbuf))

	closed := make(chan int)
	close(closed)
	fmt.Println("closed:", tryRecv(closed))

	a, b := make(chan int, 1), make(chan int, 1)
	defaults := 0
	for i := 0; i < 1000; i++ {
		a <- i
		b <- i
		select {
		case <-a:
			<-b
		case <-b:
			<-a
		default:
			defaults++
		}
	}
	fmt.Println("two ready cases and default: default taken", defaults, "times")

	lock := make(chan struct{}, 1)
	tryLock := func() bool {
		select {
		case lock <- struct{}{}:
			return true
		default:
			return false
		}
	}
	fmt.Println("trylock:", tryLock(), tryLock())
	<-lock
	fmt.Println("trylock after unlock:", tryLock())
}
