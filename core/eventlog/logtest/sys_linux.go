package logtest

import (
	"os"
	"syscall"
	"time"
)

func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// processCPU is the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is the 1-minute load average ("" when unknown).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil || len(b) == 0 {
		return ""
	}
	for i, c := range b {
		if c == ' ' {
			return string(b[:i])
		}
	}
	return ""
}
