//go:build !linux

package logtest

import "os"

func fdatasync(f *os.File) error { return f.Sync() }
