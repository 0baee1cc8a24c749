// toolpool console: the little script the pages need. Everything it shows that came from a call (output,
// arguments) goes into the page as text (textContent), never as HTML.
"use strict";

// visible mirrors the server's visible(): control characters but newline and tab as their Unicode control
// pictures (ESC as U+241B), so escape sequences are shown, never interpreted.
function visible(s) {
  return s.replace(/[\u0000-\u0008\u000b-\u001f\u007f\u0080-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g, function (c) {
    var n = c.charCodeAt(0);
    if (n < 0x20) return String.fromCharCode(0x2400 + n);
    if (n === 0x7f) return "\u2421";
    return "\\u" + n.toString(16).padStart(4, "0");
  });
}

// liveList refreshes a server-rendered list every two seconds (the approvals), replacing it only when it
// changed and the person is not in the middle of using it.
function liveList(el) {
  var url = el.getAttribute("data-live");
  var last = el.innerHTML;
  function tick() {
    if (el.contains(document.activeElement) && document.activeElement !== el) {
      return; // do not move the keyboard focus away under the person's hands
    }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } }).then(function (r) {
      if (r.redirected || !r.ok) { return null; }
      return r.text();
    }).then(function (html) {
      if (html !== null && html !== last) {
        last = html;
        el.innerHTML = html; // the console's own, server-escaped markup
      }
    }).catch(function () {});
  }
  setInterval(tick, 2000);
}

document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-live]").forEach(liveList);
});
