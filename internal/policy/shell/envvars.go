package shell

import (
	"fmt"
	"slices"
	"strings"
)

// Environment variables that make programs load or run other code, or change how the shell finds,
// reads and expands commands. Setting one (in the line, with env, with export or declare, as a for
// variable, with printf -v, or in run_shell's env argument) asks (rule code-injection-env).
//
// A list of names can never be complete, so names are also matched by the shapes such variables have:
// a prefix naming a toolchain that reads its configuration from the environment (GIT_, GO, PYTHON...),
// or a suffix naming a program, an option string or a search path (_COMMAND, FLAGS, _OPTS, PATH...).
// The few harmless names those shapes catch and that builds need are exempt.

// injectionPrefixes start variables that configure a toolchain or the loader.
var injectionPrefixes = []string{
	"UV_", "CONDA_", "POETRY_", "PIPENV_", "PDM_", "HATCH_", "TOX_", "NOX_", "PYTEST_", "COVERAGE_", "COREPACK_",
	"PNPM_", "CMAKE_", "MESON_", "CCACHE_", "SCCACHE_", "DISTCC_", "BAZEL", "OPENSSL_", "SSL_", "CURL_", "WGET",
	"RSYNC_", "GHC", "TEX", "VK_", "__EGL_", "__GLX_", "LIBGL_", "MESA_", "GTK_", "GIO_", "GST_", "QT_", "KRB5",
	"ZSTD_", "XZ_", "LZ4", "GREP_", "AWK", "SED_", "TAR_", "ZIP", "UNZIP", "MAN", "GROFF_", "GUILE_", "EMACS",
	"VIM", "NVIM_", "TCL", "TK_", "ERL_", "ELIXIR_", "MIX_", "OCAML", "DUNE_", "CABAL_", "STACK_", "SWIFT_",
	"CLANG_", "GCC_", "COMPILER_", "DEPENDENCIES_OUTPUT", "SUNPRO_", "FLASK_", "DJANGO_", "MPL", "TERRAFORM_",
	"TF_", "HELM_", "ANSIBLE_", "VAGRANT_", "PODMAN_", "CONTAINERS_", "BUILDAH_", "NIX_", "GUIX_",
	"LD_", "DYLD_", "GIT_", "BASH_", "NPM_CONFIG_", "npm_config_", "GO", "CGO_", "PYTHON", "PERL", "RUBY",
	"NODE_", "JAVA", "_JAVA", "JDK_", "MAVEN_", "GRADLE_", "CARGO_", "RUSTC", "RUSTDOC", "RUSTUP_", "PIP_",
	"YARN_", "BUNDLE_", "GEM_", "COMPOSER_", "LESS", "TEXTDOMAIN", "MAKE", "SSH_", "SUDO_", "XDG_", "HIST",
	"PROMPT_", "GLIBC_", "MALLOC_", "TERMINFO", "TERMCAP", "PKG_CONFIG", "GCONV", "DOCKER_", "KUBE",
	"GNUPG", "GPG_", "DENO_", "BUN_", "PHP", "LUA_", "R_", "JULIA_", "DOTNET_", "COMPlus_", "CORECLR_",
}

// injectionSuffixes end variables that name a program, options or a search path.
var injectionSuffixes = []string{
	"_COMMAND", "_CMD", "_PROGRAM", "_EXEC", "_EXECUTABLE", "EDITOR", "PAGER", "SHELL", "FLAGS", "_OPTS",
	"_OPTIONS", "_ARGS", "PATH", "_HOME", "HOME", "_CONFIG", "CONFIG", "_PRELOAD", "_WRAPPER", "ASKPASS",
	"_PLUGINS", "_PLUGIN_DIR", "FILE", "RC", "OPT", "INIT", "_HOOK", "_HOOKS",
	// ...or a file or directory a program reads and may run or print: OPENSSL_CONF, GTK_MODULES,
	// RSYNC_RSH, GCC_EXEC_PREFIX, CURL_CA_BUNDLE, PGSYSCONFDIR, ERL_LIBS, VK_ICD_FILENAMES...
	"_CONF", "CNF", "_MODULE", "_MODULES", "RSH", "_SSH", "_PROG", "_PREFIX", "_LAUNCHER", "_BUNDLE", "_ENGINES",
	"DIR", "DIRS", "LIB", "LIBS", "FILES", "FILENAME", "FILENAMES", "INPUTS", "_APP", "CREDENTIALS",
	"_STARTUP", "_PROFILE", "_LOADER", "_DRIVER", "_DRIVERS",
}

// injectionVars are names without such a shape.
var injectionVars = map[string]bool{
	"ENV": true, "IFS": true, "CDPATH": true, "GLOBIGNORE": true, "EXECIGNORE": true, "FIGNORE": true,
	"PS0": true, "PS1": true, "PS2": true, "PS3": true, "PS4": true, "SHELLOPTS": true, "BASHOPTS": true,
	"POSIXLY_CORRECT": true, "ZDOTDIR": true, "INPUTRC": true, "FCEDIT": true, "BROWSER": true,
	"VISUAL": true, "NLSPATH": true, "LOCPATH": true, "HOSTALIASES": true, "LOCALDOMAIN": true,
	"RES_OPTIONS": true, "CC": true, "CXX": true, "CPP": true, "AR": true, "AS": true, "LD": true, "NM": true,
	"RANLIB": true, "STRIP": true, "OBJCOPY": true, "OBJDUMP": true, "FC": true, "F77": true, "YACC": true,
	"LEX": true, "M4": true, "TMPDIR": true, "OLDPWD": true, "DIRSTACK": true, "MAIL": true, "MAILCHECK": true,
	"LANGUAGE": true, "GZIP": true, "BZIP": true, "BZIP2": true, "LZOP": true, "MAGIC": true, "NETRC": true,
	"GETCONF_DIR": true,
}

// injectionExemptValues are values that make an injection variable harmless: GOWORK=off names no file.
var injectionExemptValues = map[string][]string{"GOWORK": {"off", ""}, "GOFLAGS": {""}, "GOTOOLCHAIN": {"local"}}

// injectionSetting reports whether setting the variable to value (known: the value is known before the
// line runs) can make a program load or run other code: injectionVar, except for the harmless values.
func injectionSetting(name, value string, known bool) bool {
	if known && slices.Contains(injectionExemptValues[name], value) {
		return false
	}
	return injectionVar(name)
}

// injectionExempt are harmless names that the shapes above would catch.
var injectionExempt = map[string]bool{
	"CGO_ENABLED": true, "GOOS": true, "GOARCH": true, "GOAMD64": true, "GOARM": true, "GOARM64": true,
	"GO386": true, "GOMAXPROCS": true, "GOGC": true, "GOMEMLIMIT": true, "GOTRACEBACK": true,
	"GO111MODULE": true, "GOTESTSUM_FORMAT": true,
	"PYTHONUNBUFFERED": true, "PYTHONDONTWRITEBYTECODE": true, "PYTHONHASHSEED": true,
	"PYTHONIOENCODING": true, "PYTHONUTF8": true, "PYTHONWARNINGS": true, "PYTHONFAULTHANDLER": true,
	"NODE_ENV": true, "NODE_NO_WARNINGS": true, "GIT_TERMINAL_PROMPT": true, "npm_config_update_notifier": true,
	"NPM_CONFIG_UPDATE_NOTIFIER": true,
}

// injectionVar reports whether setting the variable can make a program load or run other code, or
// change how the shell finds and expands commands.
// checkEnvValue denies a variable whose value names a denied file (GOWORK=/workspace/.env go list makes go
// read and print it): the value, and each part of a colon-separated list, that looks like a path (it has
// a slash or starts with "." or "~") is checked against the denied globs as a read. Other rules on paths
// do not apply: a variable may well name a directory outside the workspace (PATH, GOROOT).
func (j *judge) checkEnvValue(name, value string) {
	for _, part := range strings.Split(value, ":") {
		if part == "" || !(strings.Contains(part, "/") || strings.HasPrefix(part, ".") || strings.HasPrefix(part, "~")) {
			continue
		}
		if _, err := ResolvePath(part); err != nil {
			continue
		}
		paths, _ := j.resolve(part)
		for _, p := range paths {
			if g, ok := j.paths.DeniedBy(p); ok {
				j.add(Deny, RuleDeniedPath, fmt.Sprintf("the variable %s names %s: %s", name, part, DeniedDetail(p, g)))
			}
		}
	}
}

func injectionVar(name string) bool {
	if injectionExempt[name] {
		return false
	}
	if injectionVars[name] {
		return true
	}
	for _, p := range injectionPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	upper := strings.ToUpper(name)
	for _, s := range injectionSuffixes {
		if strings.HasSuffix(upper, s) {
			return true
		}
	}
	return false
}
