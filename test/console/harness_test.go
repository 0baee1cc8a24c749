// Package console tests the web console in a real browser: Debian's headless Chromium, driven over the
// DevTools protocol by chromedp, against the real dispatcher binary (embedded NATS) and a real worker
// (private containerd).
package console

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/toolpool/toolpool/internal/stacktest"
	"github.com/toolpool/toolpool/internal/testproc"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testproc.Cleanup()
	os.Exit(code)
}

// chromiumPath is Debian's chromium (scripts/deps.sh installs it); no browser is downloaded.
const chromiumPath = "/usr/bin/chromium"

// requireChromium fails (CI=true) or skips the test unless Debian's chromium is installed.
func requireChromium(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("this test needs root, containerd and chromium: skipped under -short")
	}
	if out, err := exec.Command(chromiumPath, "--version").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("this test needs Debian's chromium at %s (make deps installs it): %v %s", chromiumPath, err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// The tenant of these tests (stacktest's): an approver (alice) and a caller.
const (
	approverToken = stacktest.ApproverToken
	callerToken   = stacktest.CallerToken
)

// stack is a running dispatcher (embedded NATS) and worker (private containerd).
type stack struct{ *stacktest.Stack }

// startStack starts the stack with the console's pool page reading the worker's metrics, and checks at the
// end that no token reached a log.
func startStack(t testing.TB) *stack {
	t.Helper()
	// The pool page reads the worker's metrics, whose address the dispatcher's config names before the
	// worker starts: a port the system just gave out (should another process take it meanwhile, the
	// worker refuses to start, saying so).
	workerListen := testproc.FreeAddr(t)
	s := &stack{stacktest.Start(t, stacktest.Options{
		Config:       "console:\n  worker_metrics: [\"http://" + workerListen + "/metrics\"]\n",
		WorkerListen: workerListen, WorkerID: "console-worker",
	})}
	t.Cleanup(func() {
		for _, p := range []*testproc.Proc{s.Dispatcher, s.Worker} {
			if strings.Contains(p.Output(), approverToken) || strings.Contains(p.Output(), callerToken) {
				t.Errorf("a token is in a log:\n%s", p.Tail(40))
			}
		}
	})
	return s
}

// submit starts a run_shell call without waiting and returns its id and first status.
func (s *stack) submit(t testing.TB, token, command string) (string, string) {
	t.Helper()
	code, v := s.Do(t, "POST", "/v1/calls", token, map[string]any{"tool": "run_shell", "args": map[string]any{"command": command}, "workspace": "ws1", "wait": false})
	id, _ := v["id"].(string)
	if code != http.StatusAccepted || id == "" {
		t.Fatalf("POST /v1/calls %q: HTTP %d %v", command, code, v)
	}
	return id, v["status"].(string)
}

// browser is one headless Chromium with a fresh profile; each newBrowser is a separate cookie jar.
func newBrowser(t testing.TB) context.Context {
	t.Helper()
	profile, err := os.MkdirTemp("", "toolpool-console-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1280, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx) // closes the browser and waits for it
		cancel()
		cancelAlloc()
		// Chromium's helpers may still be writing to the profile for a moment after it exits.
		deadline := time.Now().Add(10 * time.Second)
		for err := os.RemoveAll(profile); err != nil; err = os.RemoveAll(profile) {
			if time.Now().After(deadline) {
				t.Errorf("remove the browser's profile: %v", err)
				return
			}
			time.Sleep(50 * time.Millisecond) // polling, under the deadline above
		}
	})
	if err := chromedp.Run(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// run runs actions in the browser with a deadline.
func run(t testing.TB, ctx context.Context, timeout time.Duration, what string, actions ...chromedp.Action) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := chromedp.Run(tctx, actions...); err != nil {
		var loc, body string
		_ = chromedp.Run(ctx, chromedp.Location(&loc), chromedp.Text("body", &body, chromedp.ByQuery))
		t.Fatalf("%s: %v (page %s:\n%s)", what, err, loc, body)
	}
}

// waitText polls the text of the element sel until ok holds, or fails after timeout with the last text.
func waitText(t testing.TB, ctx context.Context, sel string, timeout time.Duration, what string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var text string
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := chromedp.Run(tctx, chromedp.Evaluate(fmt.Sprintf(`(function(){var e=document.querySelector(%q);return e?e.textContent:"";})()`, sel), &text))
		cancel()
		if err == nil && ok(text) {
			return text
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not come within %s: last text %q (err %v)", what, sel, timeout, text, err)
		}
		time.Sleep(100 * time.Millisecond) // polling the page, under the deadline above
	}
}

// screenshotDir is where the run's screenshots go: TOOLPOOL_CONSOLE_SCREENSHOTS, or a directory the test
// log names.
func screenshotDir(t testing.TB) string {
	if d := os.Getenv("TOOLPOOL_CONSOLE_SCREENSHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d, err := os.MkdirTemp("", "toolpool-console-screenshots-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// screenshot saves the whole page as name.png.
func screenshot(t testing.TB, ctx context.Context, dir, name string) {
	t.Helper()
	var png []byte
	run(t, ctx, 20*time.Second, "screenshot "+name, chromedp.FullScreenshot(&png, 100))
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// tabTo presses Tab from the top of the page until the element sel has the keyboard focus, and fails
// when 60 presses do not reach it: every control of the console is reachable from the keyboard.
func tabTo(t testing.TB, ctx context.Context, sel string) {
	t.Helper()
	run(t, ctx, 5*time.Second, "focus the page", chromedp.Evaluate(`document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)`, nil))
	for i := 0; i < 60; i++ {
		var at bool
		run(t, ctx, 5*time.Second, "press Tab", chromedp.KeyEvent(kb.Tab),
			chromedp.Evaluate(fmt.Sprintf(`document.activeElement === document.querySelector(%q)`, sel), &at))
		if at {
			var outline string
			run(t, ctx, 5*time.Second, "read the focus style", chromedp.Evaluate(`getComputedStyle(document.activeElement).outlineStyle`, &outline))
			if outline == "none" || outline == "" {
				t.Errorf("%s has the focus but shows no focus outline", sel)
			}
			return
		}
	}
	t.Fatalf("60 presses of Tab did not reach %s", sel)
}

// contrastJS returns the texts of the page whose contrast with their background is under WCAG AA's
// 4.5:1 (3:1 for large text), each as "text: ratio".
const contrastJS = `(function () {
  function rgb(c) { var m = c.match(/[\d.]+/g); return m ? m.map(Number) : [0, 0, 0, 0]; }
  function lum(c) {
    var a = c.slice(0, 3).map(function (v) { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * a[0] + 0.7152 * a[1] + 0.0722 * a[2];
  }
  function bg(el) {
    for (; el; el = el.parentElement) {
      var c = rgb(getComputedStyle(el).backgroundColor);
      if (c.length < 4 || c[3] > 0) { return c; }
    }
    return [255, 255, 255];
  }
  var bad = [];
  var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (var n = walker.nextNode(); n; n = walker.nextNode()) {
    var el = n.parentElement;
    if (!n.textContent.trim() || !el || el.offsetParent === null && getComputedStyle(el).position !== "fixed") { continue; }
    var s = getComputedStyle(el), fg = lum(rgb(s.color)), b = lum(bg(el));
    var ratio = (Math.max(fg, b) + 0.05) / (Math.min(fg, b) + 0.05);
    var large = parseFloat(s.fontSize) >= 24 || (parseFloat(s.fontSize) >= 18.66 && Number(s.fontWeight) >= 700);
    if (ratio < (large ? 3 : 4.5)) { bad.push(n.textContent.trim().slice(0, 40) + ": " + ratio.toFixed(2)); }
  }
  return bad;
})()`

// checkContrast fails for any text of the page under WCAG AA contrast.
func checkContrast(t testing.TB, ctx context.Context, page string) {
	t.Helper()
	var bad []string
	run(t, ctx, 10*time.Second, "measure contrast", chromedp.Evaluate(contrastJS, &bad))
	if len(bad) > 0 {
		t.Errorf("%s: text under WCAG AA contrast: %q", page, bad)
	}
}
