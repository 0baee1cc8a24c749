package console

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// finished is a call's page once its end is rendered: a finishing time.
var finished = regexp.MustCompile(`Finished\s*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC`)

// TestConsole drives the console as a person would, in headless Chromium against the real stack: signs in
// with the keyboard, sees an ask arrive without a reload, approves it and watches its output arrive line
// by line, cancels a running call, denies an ask, sees a hostile output as text, and, as a caller, sees no
// approve button; it takes a screenshot of each page.
func TestConsole(t *testing.T) {
	requireChromium(t)
	s := startStack(t)
	shots := screenshotDir(t)
	ctx := newBrowser(t)

	// Sign in with the keyboard: the token field has the focus, Enter submits.
	run(t, ctx, 30*time.Second, "open the sign-in page",
		chromedp.Navigate(s.URL+"/console/"),
		chromedp.WaitVisible("#token", chromedp.ByID))
	checkContrast(t, ctx, "signin")
	screenshot(t, ctx, shots, "signin")
	run(t, ctx, 30*time.Second, "sign in",
		chromedp.KeyEvent(approverToken),
		chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible("#approvals", chromedp.ByID))
	var loc string
	run(t, ctx, 5*time.Second, "location", chromedp.Location(&loc))
	if !strings.HasSuffix(loc, "/console/approvals") || strings.Contains(loc, approverToken) {
		t.Fatalf("after signing in the browser is at %q, want /console/approvals (and never the token in a URL)", loc)
	}
	waitText(t, ctx, "#approvals", 10*time.Second, "an empty approvals page", func(s string) bool { return strings.Contains(s, "Nothing waits") })

	// An ask arrives without a reload; approving it runs the call, whose output arrives line by line.
	lines := `mkdir -p build; for i in 1 2 3 4 5 6; do echo "line $i"; sleep 0.7; done`
	id, status := s.submit(t, approverToken, lines)
	if status != "pending_approval" {
		t.Fatalf("the mkdir call is %s, want pending_approval", status)
	}
	waitText(t, ctx, "#ask-"+id, 10*time.Second, "the ask on the open page", func(s string) bool {
		return strings.Contains(s, "mutating-commands") && strings.Contains(s, "it changes the workspace") && strings.Contains(s, `echo "line $i"`)
	})
	var cmdHTML string
	run(t, ctx, 5*time.Second, "read the highlighted command", chromedp.InnerHTML("#ask-"+id+" pre.command", &cmdHTML, chromedp.ByQuery))
	if !strings.Contains(cmdHTML, `<span class="sh-cmd">mkdir</span>`) {
		t.Errorf("the command is not highlighted: %s", cmdHTML)
	}
	checkContrast(t, ctx, "approvals")
	screenshot(t, ctx, shots, "approvals")
	// Approve with the keyboard: Tab from the top of the page reaches the button, Enter presses it.
	tabTo(t, ctx, "#ask-"+id+" button.approve")
	run(t, ctx, 20*time.Second, "approve",
		chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible("p.done", chromedp.ByQuery),
		chromedp.Navigate(s.URL+"/console/calls/"+id),
		chromedp.WaitVisible("#status", chromedp.ByID))
	partial := waitText(t, ctx, "#live-output", 30*time.Second, "the first lines, live", func(s string) bool { return strings.Contains(s, "line 1") })
	if strings.Contains(partial, "line 6") {
		t.Fatalf("the output arrived all at once, not line by line: %q", partial)
	}
	waitText(t, ctx, "#live-output", 30*time.Second, "the last line", func(s string) bool { return strings.Contains(s, "line 6") })
	waitText(t, ctx, "#status", 30*time.Second, "the call's end", func(s string) bool { return s == "ok" })
	waitText(t, ctx, ".panel dl", 10*time.Second, "the call's final facts", func(s string) bool {
		return finished.MatchString(s) && !strings.Contains(s, "total 0 ms")
	})
	if got := waitText(t, ctx, "#live-output", time.Second, "the whole output", func(string) bool { return true }); strings.Count(got, "line ") != 6 {
		t.Errorf("the live output is %q, want six lines, each once", got)
	}
	checkContrast(t, ctx, "call")
	screenshot(t, ctx, shots, "call")

	// Cancel a running call from its page.
	id, _ = s.submit(t, approverToken, "echo started; sleep 60")
	run(t, ctx, 20*time.Second, "open the running call",
		chromedp.Navigate(s.URL+"/console/calls/"+id),
		chromedp.WaitVisible("#cancel-form", chromedp.ByID))
	waitText(t, ctx, "#live-output", 30*time.Second, "the running call's output", func(s string) bool { return strings.Contains(s, "started") })
	run(t, ctx, 20*time.Second, "cancel", chromedp.Click("#cancel-form button", chromedp.ByQuery), chromedp.WaitVisible("#status", chromedp.ByID))
	waitText(t, ctx, "#status", 30*time.Second, "the cancelled call", func(s string) bool { return s == "cancelled" })
	if code, v := s.Do(t, "GET", "/v1/calls/"+id, approverToken, nil); code != http.StatusOK || v["status"] != "cancelled" {
		t.Fatalf("the API says the cancelled call is HTTP %d %v", code, v["status"])
	}

	// Deny an ask.
	id, _ = s.submit(t, approverToken, "mkdir never")
	run(t, ctx, 20*time.Second, "deny",
		chromedp.Navigate(s.URL+"/console/approvals"),
		chromedp.WaitVisible("#ask-"+id, chromedp.ByID),
		chromedp.SendKeys("#ask-"+id+` input[name="reason"]`, "make the directory under build/", chromedp.ByQuery),
		chromedp.Click("#ask-"+id+" button.deny", chromedp.ByQuery),
		chromedp.WaitVisible("p.done", chromedp.ByQuery))
	code, v := s.Do(t, "GET", "/v1/calls/"+id, approverToken, nil)
	if code != http.StatusForbidden || v["status"] != "denied" {
		t.Fatalf("the API says the denied call is HTTP %d %v, want 403 denied", code, v["status"])
	}
	if e, _ := v["error"].(map[string]any); e == nil || !strings.Contains(fmt.Sprint(e["message"]), ": make the directory under build/;") {
		t.Fatalf("the denied call's error is %v, want the approver's reason in it", v["error"])
	}

	// A hostile output is text, live and in the final page: no element is made of it, no script runs.
	hostile := `sleep 1; printf '<script>window.pwned=1</script><img src=x onerror="window.pwned=2"><b>bold</b>\033[31mred\033[0m\a\n'`
	id, _ = s.submit(t, approverToken, hostile)
	run(t, ctx, 20*time.Second, "open the hostile call", chromedp.Navigate(s.URL+"/console/calls/"+id), chromedp.WaitVisible("#status", chromedp.ByID))
	live := waitText(t, ctx, "#live-output", 30*time.Second, "the hostile output, live", func(s string) bool { return strings.Contains(s, "bold") })
	waitText(t, ctx, "#status", 30*time.Second, "the hostile call's end", func(s string) bool { return s == "ok" })
	run(t, ctx, 20*time.Second, "reload the hostile call", chromedp.Reload(), chromedp.WaitVisible("#status", chromedp.ByID))
	final := waitText(t, ctx, "pre.output", 5*time.Second, "the hostile output, final", func(s string) bool { return strings.Contains(s, "bold") })
	want := `<script>window.pwned=1</script><img src=x onerror="window.pwned=2"><b>bold</b>\x1b[31mred\x1b[0m\x07`
	for name, got := range map[string]string{"live": live, "final": final} {
		if !strings.Contains(got, want) {
			t.Errorf("the %s output reads %q, want the text %q", name, got, want)
		}
	}
	var pwned, elements int
	run(t, ctx, 5*time.Second, "look for injected elements",
		chromedp.Evaluate(`window.pwned ? window.pwned : 0`, &pwned),
		chromedp.Evaluate(`document.querySelectorAll("pre b, pre img, pre script, main script").length`, &elements))
	if pwned != 0 || elements != 0 {
		t.Fatalf("the hostile output ran (window.pwned=%d) or made %d elements", pwned, elements)
	}
	checkContrast(t, ctx, "call-hostile")
	screenshot(t, ctx, shots, "call-hostile")

	run(t, ctx, 20*time.Second, "the calls list", chromedp.Navigate(s.URL+"/console/calls"), chromedp.WaitVisible("table", chromedp.ByQuery))
	list := waitText(t, ctx, "table", time.Second, "the calls list", func(string) bool { return true })
	for _, want := range []string{"cancelled", "denied", "ok", "run_shell"} {
		if !strings.Contains(list, want) {
			t.Errorf("the calls list does not show %q: %s", want, list)
		}
	}
	run(t, ctx, 20*time.Second, "filter the calls", chromedp.Navigate(s.URL+"/console/calls?status=denied"), chromedp.WaitVisible("table", chromedp.ByQuery))
	if list = waitText(t, ctx, "tbody", time.Second, "the denied calls", func(string) bool { return true }); strings.Contains(list, "cancelled") || !strings.Contains(list, "denied") {
		t.Errorf("status=denied lists %s", list)
	}
	checkContrast(t, ctx, "calls")
	screenshot(t, ctx, shots, "calls")

	// Workspaces: the list, browsing read-only into a directory, a file as text, a snapshot.
	if code, v := s.Do(t, "POST", "/v1/calls", approverToken, map[string]any{"tool": "write_file", "workspace": "ws1",
		"args": map[string]any{"path": "build/<i>notes.txt", "content": "hello \x1b[1m<b>bold</b>\n"}}); code != http.StatusOK || v["status"] != "ok" {
		t.Fatalf("write a file: HTTP %d %v", code, v)
	}
	run(t, ctx, 20*time.Second, "the workspaces", chromedp.Navigate(s.URL+"/console/workspaces"), chromedp.WaitVisible("table", chromedp.ByQuery))
	checkContrast(t, ctx, "workspaces")
	screenshot(t, ctx, shots, "workspaces")
	run(t, ctx, 30*time.Second, "browse ws1",
		chromedp.Click(`a[href="/console/workspaces/ws1"]`, chromedp.ByQuery),
		chromedp.WaitVisible("table.files", chromedp.ByQuery),
		chromedp.Click(`a[href="/console/workspaces/ws1?path=build"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`a[href$="%3ci%3enotes.txt"]`, chromedp.ByQuery))
	checkContrast(t, ctx, "workspace")
	screenshot(t, ctx, shots, "workspace")
	run(t, ctx, 30*time.Second, "open the file", chromedp.Click(`a[href$="%3ci%3enotes.txt"]`, chromedp.ByQuery), chromedp.WaitVisible("#download", chromedp.ByID))
	if got := waitText(t, ctx, "pre.output", 5*time.Second, "the file's text", func(s string) bool { return strings.Contains(s, "bold") }); got != "hello \\x1b[1m<b>bold</b>\n" {
		t.Errorf("the file reads %q in the page", got)
	}
	checkContrast(t, ctx, "file")
	screenshot(t, ctx, shots, "file")
	run(t, ctx, 30*time.Second, "take a snapshot",
		chromedp.Navigate(s.URL+"/console/workspaces/ws1"),
		chromedp.SendKeys(`input[name="snapshot"]`, "from-console", chromedp.ByQuery),
		chromedp.Click("#take-snapshot", chromedp.ByID),
		chromedp.WaitVisible("p.done", chromedp.ByQuery))
	if got := waitText(t, ctx, "ul.snapshots", 5*time.Second, "the snapshot", func(s string) bool { return strings.Contains(s, "from-console") }); !strings.Contains(got, "Restore") {
		t.Errorf("the snapshot list reads %q", got)
	}

	// The pool at a glance: the dispatcher's metrics and the worker's.
	run(t, ctx, 20*time.Second, "the pool", chromedp.Navigate(s.URL+"/console/pool"), chromedp.WaitVisible("#workers", chromedp.ByID))
	if got := waitText(t, ctx, "#workers tbody", 5*time.Second, "the worker's row", func(string) bool { return true }); !strings.Contains(got, "0 / 4") || !strings.Contains(got, "up") {
		t.Errorf("the worker's row reads %q, want 0 of 4 slots busy and containerd up", got)
	}
	if got := waitText(t, ctx, "#calls-per-status", 5*time.Second, "calls per status", func(string) bool { return true }); !strings.Contains(got, "cancelled") || !strings.Contains(got, "ok") {
		t.Errorf("calls per status reads %q", got)
	}
	checkContrast(t, ctx, "pool")
	screenshot(t, ctx, shots, "pool")

	// A caller's browser: no approve button, while an ask waits on the approver's open page.
	run(t, ctx, 20*time.Second, "the approvals", chromedp.Navigate(s.URL+"/console/approvals"), chromedp.WaitVisible("#approvals", chromedp.ByID))
	id, _ = s.submit(t, callerToken, "mkdir from-the-bot")
	caller := newBrowser(t)
	run(t, caller, 30*time.Second, "sign in as a caller",
		chromedp.Navigate(s.URL+"/console/signin"),
		chromedp.SendKeys("#token", callerToken, chromedp.ByID),
		chromedp.Submit("#token", chromedp.ByID),
		chromedp.WaitVisible("#approvals", chromedp.ByID))
	text := waitText(t, caller, "#approvals", 5*time.Second, "the caller's approvals page", func(s string) bool { return strings.Contains(s, "may not approve") })
	var buttons int
	run(t, caller, 5*time.Second, "count buttons", chromedp.Evaluate(`document.querySelectorAll("button.approve, button.deny, button.always").length`, &buttons))
	if buttons != 0 || strings.Contains(text, id) {
		t.Fatalf("a caller's console shows %d decision buttons (page: %s)", buttons, text)
	}
	screenshot(t, caller, shots, "approvals-caller")
	waitText(t, ctx, "#ask-"+id, 10*time.Second, "the bot's ask on the approver's page", func(s string) bool { return strings.Contains(s, "from-the-bot") })

	// Signing out in another tab of the same browser ends the session: the open approvals page goes to
	// the sign-in page by itself at its next refresh, rather than going stale.
	tab, closeTab := chromedp.NewContext(ctx)
	defer closeTab()
	run(t, tab, 20*time.Second, "sign out in another tab",
		chromedp.Navigate(s.URL+"/console/calls"),
		chromedp.Click(".signout button", chromedp.ByQuery),
		chromedp.WaitVisible("#token", chromedp.ByID))
	deadline := time.Now().Add(10 * time.Second)
	for loc = ""; !strings.HasSuffix(loc, "/console/signin"); {
		if time.Now().After(deadline) {
			t.Fatalf("the signed-out approvals page is still at %s", loc)
		}
		time.Sleep(100 * time.Millisecond) // polling the page, under the deadline above
		run(t, ctx, 5*time.Second, "location", chromedp.Location(&loc))
	}
}
