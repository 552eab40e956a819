// Command ticker is the workload of the restore benchmark
// (bench_restore_e2e_test.go): a static program that fills N MiB with a
// pseudo-random pattern (nothing for a runtime to skip or deduplicate),
// then prints a tick with its CLOCK_REALTIME stamp every 10 ms. On SIGUSR1
// it checks every byte against the pattern and prints the outcome, which
// is how the benchmark proves a restored process is the same one with its
// memory intact.
//
//	ticker MIB SEED
//
// Output lines: "ready PID", "tick N UNIXNANO", "verify ok|bad PID N".
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: ticker MIB SEED")
		os.Exit(2)
	}
	mib, err1 := strconv.Atoi(os.Args[1])
	seed, err2 := strconv.ParseUint(os.Args[2], 10, 64)
	if err1 != nil || err2 != nil || mib <= 0 || seed == 0 {
		fmt.Fprintln(os.Stderr, "ticker: MIB and SEED must be positive numbers")
		os.Exit(2)
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(make([]byte, mib<<20)))), mib<<17)
	fill(words, seed)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	out := bufio.NewWriterSize(os.Stdout, 256)
	fmt.Fprintf(out, "ready %d\n", os.Getpid())
	out.Flush()
	t := time.NewTicker(10 * time.Millisecond)
	for n := 1; ; {
		select {
		case <-t.C:
			fmt.Fprintf(out, "tick %d %d\n", n, time.Now().UnixNano())
			n++
		case <-sig:
			ok := "ok"
			if !check(words, seed) {
				ok = "bad"
			}
			fmt.Fprintf(out, "verify %s %d %d\n", ok, os.Getpid(), n)
		}
		out.Flush()
	}
}

// next is xorshift64: cheap, and no two words of a page alike.
func next(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}

func fill(w []uint64, x uint64) {
	for i := range w {
		x = next(x)
		w[i] = x
	}
}

func check(w []uint64, x uint64) bool {
	for i := range w {
		x = next(x)
		if w[i] != x {
			return false
		}
	}
	return true
}
