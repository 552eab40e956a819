//go:build seccomp

package main

func init() { buildTags = "seccomp" }
