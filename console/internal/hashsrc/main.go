// Command hashsrc prints the hash of the console's sources (console.SourceHash)
// for `make console` to record in dist/SOURCE_HASH.
package main

import (
	"fmt"
	"os"

	"github.com/amber-run/amber/console"
)

func main() {
	dir := "console"
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	h, err := console.SourceHash(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hashsrc:", err)
		os.Exit(1)
	}
	fmt.Println(h)
}
