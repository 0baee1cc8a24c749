package console

import (
	"html/template"
	"strings"
)

// highlightShell returns a command line as HTML for reading: every character of it, each control
// character made visible (visibleHTML), escaped, with spans that mark the programs a line runs (class
// "sh-cmd"), operators ("sh-op"), quoted strings ("sh-str"), variables ("sh-var") and comments
// ("sh-com"). It is a reading aid, not the policy's analysis: the text shown is exactly the command.
func highlightShell(line string) template.HTML {
	var b strings.Builder
	span := func(class, text string) {
		if class == "" {
			b.WriteString(string(visibleHTML(text)))
			return
		}
		b.WriteString(`<span class="` + class + `">` + string(visibleHTML(text)) + `</span>`)
	}
	cmdNext := true // the next word is a program
	rs := []rune(line)
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case r == ' ' || r == '\t' || r == '\n':
			j := i
			for j < len(rs) && (rs[j] == ' ' || rs[j] == '\t' || rs[j] == '\n') {
				if rs[j] == '\n' {
					cmdNext = true
				}
				j++
			}
			span("", string(rs[i:j]))
			i = j
		case strings.ContainsRune(";&|()<>", r):
			j := i + 1
			for j < len(rs) && j < i+2 && strings.ContainsRune("&|>", rs[j]) {
				j++
			}
			op := string(rs[i:j])
			cmdNext = op != ">" && op != ">>" && op != "<" && op != ")"
			span("sh-op", op)
			i = j
		case r == '\'' || r == '"':
			j := i + 1
			for j < len(rs) && rs[j] != r {
				if r == '"' && rs[j] == '\\' && j+1 < len(rs) {
					j++
				}
				j++
			}
			if j < len(rs) {
				j++
			}
			span("sh-str", string(rs[i:j]))
			cmdNext = false
			i = j
		case r == '#' && (i == 0 || strings.ContainsRune(" \t\n;&|", rs[i-1])):
			j := i
			for j < len(rs) && rs[j] != '\n' {
				j++
			}
			span("sh-com", string(rs[i:j]))
			i = j
		case r == '$':
			j := i + 1
			for j < len(rs) && (rs[j] == '_' || rs[j] == '{' || rs[j] == '}' || isAlnum(rs[j])) {
				j++
			}
			span("sh-var", string(rs[i:j]))
			cmdNext = false
			i = j
		default:
			j := i
			for j < len(rs) && !strings.ContainsRune(" \t\n;&|()<>'\"$", rs[j]) {
				j++
			}
			word := string(rs[i:j])
			switch {
			case cmdNext && strings.Contains(word, "=") && !strings.HasPrefix(word, "="):
				span("sh-var", word) // an assignment before the program
			case cmdNext:
				span("sh-cmd", word)
				cmdNext = false
			default:
				span("", word)
			}
			i = j
		}
	}
	return template.HTML(b.String())
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}
