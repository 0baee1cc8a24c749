// Command imgcat prints the files named on its command line. TestImageRootedWorker builds it static and
// puts it in a test image that has no shell, as the program of a custom tool, to read a file that only the
// image's root holds.
package main

import (
	"fmt"
	"os"
)

func main() {
	for _, name := range os.Args[1:] {
		b, err := os.ReadFile(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
	}
}
