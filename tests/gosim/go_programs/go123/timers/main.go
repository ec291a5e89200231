//go:build go1.23

// Command timers checks the timer rules of Go 1.23 (this module's go line turns them on):
// timer channels are synchronous, so len and cap report 0; once Stop or Reset returns,
// no value from before the call is received; Stop and Reset report true while the timer
// is pending, which includes a value that fired but was not yet received; a ticker drops
// ticks for a slow receiver and sends nothing after Stop; AfterFunc runs its function in
// its own goroutine unless stopped first; time.After bounds a select.
//
// Durations are multiples of unit; every printed line is a boolean or an order, never a
// measured time. A line that depends on which of two events comes first has a margin of
// at least a unit between them (the slow-ticker polls excepted: they are microseconds
// apart, and only a tick falling due between them could change the second one).
package main

import (
	"fmt"
	"time"
)

const unit = 20 * time.Millisecond

// poll reports whether a value is ready on c, taking it if so.
func poll(c <-chan time.Time) string {
	select {
	case <-c:
		return "value"
	default:
		return "empty"
	}
}

func main() {
	t := time.NewTimer(2 * unit)
	fmt.Println("stop before firing:", t.Stop(), "then again:", t.Stop())
	time.Sleep(3 * unit)
	fmt.Println("stopped timer's channel:", poll(t.C))

	t = time.NewTimer(unit)
	time.Sleep(2 * unit)
	fmt.Println("fired, unreceived: len", len(t.C), "cap", cap(t.C))
	fmt.Println("stop with a fired, unreceived value:", t.Stop())
	fmt.Println("channel after that stop:", poll(t.C))

	t = time.NewTimer(unit)
	time.Sleep(2 * unit)
	resetAt := time.Now()
	fmt.Println("reset with a fired, unreceived value:", t.Reset(unit))
	fmt.Println("channel right after reset:", poll(t.C))
	v := <-t.C
	fmt.Println("received value is from the new setting:", !v.Before(resetAt.Add(unit)))
	fmt.Println("stop after receiving:", t.Stop())
	fmt.Println("reset of a stopped timer:", t.Reset(unit))
	<-t.C
	fmt.Println("the reset timer fired")
	fmt.Println("reset after it fired and was received:", t.Reset(10*unit))
	fmt.Println("stop while pending:", t.Stop())

	t = time.NewTimer(0)
	<-t.C
	fmt.Println("zero duration timer fired")
	t = time.NewTimer(-unit)
	<-t.C
	fmt.Println("negative duration timer fired")

	// A receiver parked on t.C stays parked after Stop: Stop does not close the channel,
	// and the value the timer would have sent at 2 units never comes.
	t = time.NewTimer(2 * unit)
	got := make(chan string)
	go func() {
		select {
		case <-t.C:
			got <- "receiver got a value after stop"
		case <-time.After(4 * unit):
			got <- "receiver still waiting after stop"
		}
	}()
	time.Sleep(unit / 2)
	fmt.Println("stop with a parked receiver:", t.Stop())
	fmt.Println(<-got)

	tk := time.NewTicker(unit)
	prev := time.Now()
	for i := 0; i < 3; i++ {
		tv := <-tk.C
		fmt.Println("tick", i, "later than the one before:", tv.After(prev))
		prev = tv
	}
	fmt.Println("ticker channel: len", len(tk.C), "cap", cap(tk.C))
	time.Sleep(unit + unit/2)
	tk.Stop()
	fmt.Println("ticker channel after stop:", poll(tk.C))
	time.Sleep(3 * unit)
	fmt.Println("and later:", poll(tk.C))
	tk.Reset(unit)
	<-tk.C
	fmt.Println("tick after reset")
	time.Sleep(5*unit + unit/2)
	fmt.Println("slow receiver, first poll:", poll(tk.C))
	fmt.Println("slow receiver, second poll:", poll(tk.C))
	tk.Stop()

	ran := make(chan string, 4)
	f := time.AfterFunc(2*unit, func() { ran <- "afterfunc ran" })
	fmt.Println("afterfunc stop before it runs:", f.Stop())
	time.Sleep(3 * unit)
	fmt.Println("calls after stop:", len(ran))
	f = time.AfterFunc(unit, func() { ran <- "afterfunc ran" })
	fmt.Println(<-ran)
	fmt.Println("afterfunc stop after it ran:", f.Stop())
	fmt.Println("afterfunc reset after it ran:", f.Reset(unit))
	fmt.Println(<-ran)

	never := make(chan int)
	select {
	case <-never:
		fmt.Println("select: never sent")
	case <-time.After(unit):
		fmt.Println("select: timed out")
	}
	data := make(chan string)
	go func() {
		time.Sleep(unit)
		data <- "data"
	}()
	select {
	case s := <-data:
		fmt.Println("select: got", s, "before the timeout")
	case <-time.After(20 * unit):
		fmt.Println("select: timed out")
	}
	timeouts := 0
	for i := 0; i < 3; i++ {
		select {
		case <-never:
		case <-time.After(unit / 4):
			timeouts++
		}
	}
	fmt.Println("select loop timeouts:", timeouts)
}
