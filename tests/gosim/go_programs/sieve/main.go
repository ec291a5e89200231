// Command sieve prints the first 100 primes found by a chain of filter goroutines, one
// goroutine per prime, each passing on the numbers its prime does not divide; then the
// number of goroutines left blocked in the chain.
package main

import (
	"fmt"
	"runtime"
)

func count(out chan<- int) {
	for n := 2; ; n++ {
		out <- n
	}
}

func sift(in <-chan int, out chan<- int, p int) {
	for {
		n := <-in
		if n%p != 0 {
			out <- n
		}
	}
}

func main() {
	src := make(chan int)
	go count(src)
	for found := 0; found < 100; found++ {
		p := <-src
		fmt.Println(p)
		next := make(chan int)
		go sift(src, next, p)
		src = next
	}
	fmt.Println("goroutines:", runtime.NumGoroutine())
}
