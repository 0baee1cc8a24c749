package workspace

import "syscall"

type syscallStat = syscall.Stat_t
