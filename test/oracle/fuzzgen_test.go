package oracle

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// generate returns n lines built at random (from a fixed seed, so a failure reproduces) out of the
// pieces the corpus's classes are made of: commands, some of which act (touch p, rm, id), wrapped,
// quoted, encoded, commented, continued and joined in every way the shell allows.
func generate(seed uint64, n int) []oracleLine {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]oracleLine, 0, n)
	for len(out) < n {
		out = append(out, oracleLine{cmd: genLine(r, 0)})
	}
	return out
}

var (
	genCommands = []string{"ls", "cat README.md", "echo hi", "touch p", "rm -f names.txt", "id", "pwd",
		"grep -n x main.go", "true", "head -n1 main.go", "cat .env", "wc -l names.txt", "git status", "sleep 0.01"}
	genJoins    = []string{"; ", " && ", " || ", " | ", "\n", " & "}
	genWrappers = []string{"env ", "nice ", "timeout 5 ", "nohup ", "command ", "stdbuf -oL ", "setsid ", "exec ", "time "}
)

func genLine(r *rand.Rand, depth int) string {
	var b strings.Builder
	parts := 1 + r.IntN(3)
	for i := 0; i < parts; i++ {
		if i > 0 {
			b.WriteString(genJoins[r.IntN(len(genJoins))])
		}
		b.WriteString(genCommand(r, depth))
	}
	return b.String()
}

func genCommand(r *rand.Rand, depth int) string {
	words := strings.Fields(genCommands[r.IntN(len(genCommands))])
	for i := range words {
		if r.IntN(4) == 0 {
			words[i] = genMangle(r, words[i])
		}
	}
	cmd := strings.Join(words, " ")
	switch k := r.IntN(14); {
	case k == 0:
		cmd = genWrappers[r.IntN(len(genWrappers))] + cmd
	case k == 1 && depth < 2:
		cmd = "sh -c " + shQuote(genLine(r, depth+1))
	case k == 2 && depth < 2:
		cmd = "bash -c " + shQuote(genLine(r, depth+1))
	case k == 3 && depth < 2:
		cmd = "eval " + shQuote(genLine(r, depth+1))
	case k == 4:
		cmd = "echo $(" + cmd + ")"
	case k == 5:
		cmd = "echo " + shQuote(cmd) + " | sh"
	case k == 6:
		cmd = cmd + " # note \\"
	case k == 7:
		cmd = cmd + " > out.txt"
	case k == 8:
		cmd = "{ " + cmd + "; }"
	case k == 9:
		cmd = "(" + cmd + ")"
	case k == 10:
		cmd = "if true; then " + cmd + "; fi"
	case k == 11:
		cmd = "printf '%s\\n' " + shQuote(cmd) + " | bash"
	case k == 12:
		cmd = "f() { " + cmd + "; }; f"
	}
	return cmd
}

// genMangle writes a word differently without changing what bash reads (dash may read some of the
// forms differently, which is the point).
func genMangle(r *rand.Rand, w string) string {
	if w == "" {
		return w
	}
	k := r.IntN(len(w))
	switch r.IntN(7) {
	case 0:
		return "'" + w + "'"
	case 1:
		return `"` + w + `"`
	case 2:
		return w[:k] + "''" + w[k:]
	case 3:
		return w[:k] + `\` + w[k:]
	case 4:
		return w[:k] + fmt.Sprintf(`$'\x%02x'`, w[k]) + w[k+1:]
	case 5:
		return w[:k] + fmt.Sprintf(`$'\%03o'`, w[k]) + w[k+1:]
	default:
		return w + "\\\n"
	}
}

func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
