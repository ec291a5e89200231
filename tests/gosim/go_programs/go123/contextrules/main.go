// Command contextrules shows two rules of the context package: every constructor
// panics on a nil parent ("cannot create context from nil parent"), and the stop
// function AfterFunc returns reports true the first time it prevents f from running,
// even for a context that is never done, and false after that.
package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

type key struct{}

func try(name string, f func()) {
	defer func() { fmt.Printf("%s(nil): %v\n", name, recover()) }()
	f()
}

func main() {
	var nilctx context.Context
	cause := errors.New("why")
	try("WithCancel", func() { _, cancel := context.WithCancel(nilctx); cancel() })
	try("WithCancelCause", func() { _, cancel := context.WithCancelCause(nilctx); cancel(nil) })
	try("WithDeadline", func() { _, cancel := context.WithDeadline(nilctx, time.Now()); cancel() })
	try("WithDeadlineCause", func() { _, cancel := context.WithDeadlineCause(nilctx, time.Now(), cause); cancel() })
	try("WithTimeout", func() { _, cancel := context.WithTimeout(nilctx, time.Second); cancel() })
	try("WithTimeoutCause", func() { _, cancel := context.WithTimeoutCause(nilctx, time.Second, cause); cancel() })
	try("WithValue", func() { _ = context.WithValue(nilctx, key{}, 1) })
	try("WithoutCancel", func() { _ = context.WithoutCancel(nilctx) })

	ran := make(chan bool, 1)
	stop := context.AfterFunc(context.Background(), func() { ran <- true })
	first := stop()
	fmt.Printf("AfterFunc(Background) stop: %v, again: %v\n", first, stop())

	ctx, cancel := context.WithCancel(context.Background())
	stop = context.AfterFunc(ctx, func() { ran <- true })
	fmt.Printf("AfterFunc(cancellable) stop before cancel: %v\n", stop())
	cancel()
	time.Sleep(10 * time.Millisecond)
	fmt.Printf("f ran: %d times\n", len(ran))

	ctx, cancel = context.WithCancel(context.Background())
	stop = context.AfterFunc(ctx, func() { ran <- true })
	cancel()
	<-ran
	fmt.Printf("AfterFunc stop after f started: %v\n", stop())

	ctx, cancel = context.WithDeadlineCause(context.Background(), time.Now().Add(time.Millisecond), cause)
	defer cancel()
	<-ctx.Done()
	fmt.Printf("WithDeadlineCause: err %v, cause %v\n", ctx.Err(), context.Cause(ctx))
	ctx, cancel = context.WithTimeoutCause(context.Background(), time.Millisecond, cause)
	defer cancel()
	<-ctx.Done()
	fmt.Printf("WithTimeoutCause: err %v, cause %v\n", ctx.Err(), context.Cause(ctx))
	ctx, cancel = context.WithTimeoutCause(context.Background(), time.Hour, cause)
	cancel()
	fmt.Printf("WithTimeoutCause cancelled first: err %v, cause %v\n", ctx.Err(), context.Cause(ctx))
}
