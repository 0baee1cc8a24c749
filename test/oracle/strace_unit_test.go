package oracle

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestSplitRuns: a trace of the driver's wrapper splits into the run of each shell; the wrapper's own
// work between the runs (resetting the workspace) belongs to neither, and a caller chain ends at the
// run's shell, above which only the wrapper and its timeout are.
func TestSplitRuns(t *testing.T) {
	const trace = `100 execve("/bin/sh", ["/bin/sh", "-c", "..."], 0x0 /* 3 vars */) = 0
100 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD) = 101
101 execve("/usr/bin/timeout", ["timeout"], 0x0 /* 3 vars */) = 0
101 clone(child_stack=NULL, flags=SIGCHLD) = 102
102 execve("/bin/sh", ["/bin/sh", "-c", "touch p; sh -c 'rm x'"], 0x0 /* 3 vars */) = 0
102 clone(child_stack=NULL, flags=SIGCHLD) = 103
103 execve("/usr/bin/touch", ["touch", "p"], 0x0 /* 3 vars */) = 0
103 openat(AT_FDCWD</workspace>, "p", O_WRONLY|O_CREAT|O_NOCTTY|O_NONBLOCK, 0666) = 3</workspace/p>
102 execve("/bin/sh", ["sh", "-c", "rm x"], 0x0 /* 3 vars */) = 0
102 unlinkat(AT_FDCWD</workspace>, "x", 0) = 0
100 clone(child_stack=NULL, flags=SIGCHLD) = 104
104 execve("/bin/rm", ["rm", "-rf"], 0x0 /* 3 vars */) = 0
104 unlinkat(AT_FDCWD</workspace>, "p", 0) = 0
100 clone(child_stack=NULL, flags=SIGCHLD) = 105
105 execve("/usr/bin/timeout", ["timeout"], 0x0 /* 3 vars */) = 0
105 clone(child_stack=NULL, flags=SIGCHLD) = 106
106 execve("/bin/bash", ["/bin/bash", "-c", "echo > q"], 0x0 /* 3 vars */) = 0
106 openat(AT_FDCWD</workspace>, "q", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 3</workspace/q>
`
	runs := splitRuns(parseTrace(strings.NewReader(trace), "/workspace"))
	if len(runs) != 2 {
		t.Fatalf("got runs %v, want sh and bash", slices.Sorted(maps.Keys(runs)))
	}
	type ev struct {
		what   string
		first  bool
		caller []string
	}
	got := map[string][]ev{}
	for name, r := range runs {
		for _, e := range r.execs {
			got[name] = append(got[name], ev{"exec " + e.path, e.first, e.caller})
		}
		for _, f := range r.files {
			got[name] = append(got[name], ev{f.syscall + " " + f.path, false, f.caller})
		}
	}
	want := map[string][]ev{
		"sh": {
			{"exec /bin/sh", true, []string{"timeout"}},
			{"exec /usr/bin/touch", false, []string{"sh", "sh"}},
			{"exec /bin/sh", false, []string{"sh"}},
			{"openat /workspace/p", false, []string{"touch", "sh"}},
			{"unlinkat /workspace/x", false, []string{"sh"}},
		},
		"bash": {
			{"exec /bin/bash", true, []string{"timeout"}},
			{"openat /workspace/q", false, []string{"bash"}},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("splitRuns:\n got %+v\nwant %+v", got, want)
	}
}
