// Command amber is Amber's one binary: the daemon (`amber up`), the CLI and
// the agent harness. This is the only package that picks implementations.
package main

import (
	"fmt"
	"os"
)

var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println("amber", version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: amber version")
	os.Exit(2)
}
