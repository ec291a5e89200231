// Command uniform checks that select chooses uniformly among ready cases. For each
// scenario it runs 20,000 selects whose cases are all ready and applies two chi-square
// tests at p = 1e-6: the counts of each case (k-1 degrees of freedom), and the counts of
// each ordered pair of consecutive choices, taken as 10,000 disjoint pairs (k*k-1 degrees
// of freedom), which a round-robin or alternating chooser fails however even its counts.
// It prints "pass" or, on failure, the counts: the output is deterministic unless the
// chooser is biased (or a one-in-a-million fluke happens).
package main

import "fmt"

const rounds = 20000

// Chi-square quantiles at 1 - 1e-6, by degrees of freedom.
var limit = map[int]float64{1: 23.93, 2: 27.63, 3: 30.66, 8: 42.70}

func chiSquare(counts []int, total int) float64 {
	want := float64(total) / float64(len(counts))
	x := 0.0
	for _, c := range counts {
		d := float64(c) - want
		x += d * d / want
	}
	return x
}

func report(name string, k int, choices []int) {
	counts := make([]int, k)
	for _, c := range choices {
		if c >= k {
			fmt.Println(name+":", "FAIL a nil case fired")
			return
		}
		counts[c]++
	}
	pairs := make([]int, k*k)
	for i := 0; i+1 < len(choices); i += 2 {
		pairs[choices[i]*k+choices[i+1]]++
	}
	x1 := chiSquare(counts, len(choices))
	x2 := chiSquare(pairs, len(choices)/2)
	if x1 < limit[k-1] && x2 < limit[k*k-1] {
		fmt.Println(name+":", "pass")
	} else {
		fmt.Printf("%s: FAIL counts=%v pairs=%v chi2=%.1f,%.1f\n", name, counts, pairs, x1, x2)
	}
}

func main() {
	a, b, c := make(chan int, 1), make(chan int, 1), make(chan int, 1)
	choices := make([]int, 0, rounds)
	for i := 0; i < rounds; i++ {
		a <- i
		b <- i
		c <- i
		select {
		case <-a:
			<-b
			<-c
			choices = append(choices, 0)
		case <-b:
			<-a
			<-c
			choices = append(choices, 1)
		case <-c:
			<-a
			<-b
			choices = append(choices, 2)
		}
	}
	report("three buffered receives", 3, choices)

	choices = choices[:0]
	for i := 0; i < rounds; i++ {
		a <- i
		b <- i
		select {
		case <-a:
			<-b
			choices = append(choices, 0)
		case <-b:
			<-a
			choices = append(choices, 1)
		}
	}
	report("two buffered receives", 2, choices)

	x, y, z := make(chan int), make(chan int), make(chan int)
	close(x)
	close(y)
	close(z)
	choices = choices[:0]
	for i := 0; i < rounds; i++ {
		select {
		case <-x:
			choices = append(choices, 0)
		case <-y:
			choices = append(choices, 1)
		case <-z:
			choices = append(choices, 2)
		}
	}
	report("three closed channels", 3, choices)

	var never chan int
	room := make(chan int, 1)
	choices = choices[:0]
	for i := 0; i < rounds; i++ {
		a <- i
		b <- i
		select {
		case room <- i:
			<-room
			<-a
			<-b
			choices = append(choices, 0)
		case <-never:
			choices = append(choices, 3)
		case <-a:
			<-b
			choices = append(choices, 1)
		case <-b:
			<-a
			choices = append(choices, 2)
		case never <- i:
			choices = append(choices, 3)
		}
	}
	report("send and receives beside nil cases", 3, choices)
}
