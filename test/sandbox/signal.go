package sandbox

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// CloseOnSignal makes SIGINT and SIGTERM close every open sandbox of this
// process (stopping agents and deleting namespaces) before exiting with
// 128+signal. Call it once at start-up of a program or test binary; the
// returned function undoes it.
func CloseOnSignal() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	quit := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			fmt.Fprintf(os.Stderr, "sandbox: %v: removing the sandboxes\n", sig)
			CloseAll()
			code := 130
			if sig == syscall.SIGTERM {
				code = 143
			}
			os.Exit(code)
		case <-quit:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(quit)
	}
}
