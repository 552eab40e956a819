package main

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
)

var signalNames = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "ILL": syscall.SIGILL,
	"ABRT": syscall.SIGABRT, "FPE": syscall.SIGFPE, "KILL": syscall.SIGKILL, "SEGV": syscall.SIGSEGV,
	"PIPE": syscall.SIGPIPE, "ALRM": syscall.SIGALRM, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2, "BUS": syscall.SIGBUS, "XCPU": syscall.SIGXCPU, "XFSZ": syscall.SIGXFSZ,
}

// parseSignalName reads "SIGKILL", "KILL", "killed" or "9".
func parseSignalName(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return syscall.Signal(n), nil
	}
	up := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if sig, ok := signalNames[up]; ok {
		return sig, nil
	}
	for _, sig := range signalNames {
		if strings.EqualFold(sig.String(), s) {
			return sig, nil
		}
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}
