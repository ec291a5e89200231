// Command timerdeadlock shows that, from Go 1.23, a timer channel nobody is receiving
// from does not keep a deadlocked program alive: the runtime keeps such a timer out of
// its heap until a goroutine blocks on the channel, so with every goroutine blocked the
// deadlock is reported at once, whether the timer is a Ticker, time.After or a Timer,
// and however far off it is. A goroutine blocked on the timer's channel is different:
// the timer will wake it, so there is no deadlock. The argument picks the case.
package main

import (
	"fmt"
	"os"
	"time"
)

func main() {
	never := make(chan int)
	switch os.Args[1] {
	case "ticker":
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		fmt.Println("main: a ticker runs; receiving where nobody sends")
		<-never
	case "after":
		c := time.After(time.Hour)
		fmt.Println("main: an hour's time.After is pending; receiving where nobody sends")
		<-never
		<-c
	case "timer":
		t := time.NewTimer(time.Hour)
		defer t.Stop()
		fmt.Println("main: an hour's Timer is pending; receiving where nobody sends")
		<-never
	case "receiver":
		t := time.NewTimer(10 * time.Millisecond)
		woke := make(chan string)
		go func() {
			<-t.C
			woke <- "receiver: the timer woke me"
		}()
		fmt.Println("main: a goroutine waits on a timer's channel")
		fmt.Println(<-woke)
	}
}
