//go:build !linux

package logtest

import (
	"os"
	"time"
)

func fdatasync(f *os.File) error { return f.Sync() }

func processCPU() time.Duration { return 0 }

func loadAvg() string { return "" }
