// toolpool console: the little script the pages need. Everything it shows that came from a call (output,
// arguments) goes into the page as text (textContent), never as HTML.
"use strict";

// appendVisible appends text to el as the server's visibleHTML shows it: printable runs as text nodes,
// each control character but newline and tab as its escape (\x1b for ESC, \u202e for a bidirectional
// override) in a span of class "ctl", so escape sequences are shown, never interpreted. Nothing of text
// ever becomes markup.
var controlChars = /[\u0000-\u0008\u000b-\u001f\u007f\u0080-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
function appendVisible(el, text) {
  var at = 0;
  text.replace(controlChars, function (c, i) {
    if (i > at) { el.appendChild(document.createTextNode(text.slice(at, i))); }
    var n = c.charCodeAt(0), span = document.createElement("span");
    span.className = "ctl";
    span.textContent = n < 0x80 ? "\\x" + n.toString(16).padStart(2, "0") : "\\u" + n.toString(16).padStart(4, "0");
    el.appendChild(span);
    at = i + 1;
    return c;
  });
  if (at < text.length) { el.appendChild(document.createTextNode(text.slice(at))); }
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
      if (r.redirected) { window.location.assign(r.url); return null; } // signed out: to the sign-in page
      if (!r.ok) { return null; }
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

// follow shows a running call's output as it is printed, from the call's event stream (status changes,
// stdout and stderr chunks, then the result); an EventSource that is cut reconnects by itself and resumes
// with Last-Event-ID, missing nothing and repeating nothing.
function follow(panel) {
  var out = document.getElementById("live-output");
  var status = document.getElementById("status");
  var worker = document.getElementById("worker");
  var es = new EventSource(panel.getAttribute("data-follow"));
  function append(stream, text) {
    var atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    var span = document.createElement("span");
    span.className = stream;
    appendVisible(span, text);
    out.appendChild(span);
    if (atEnd) { out.scrollTop = out.scrollHeight; }
  }
  function chunk(stream) {
    return function (e) {
      var d = JSON.parse(e.data);
      if (d.text !== undefined) { append(stream, d.text); return; }
      if (d.base64 !== undefined) {
        var bin = atob(d.base64), bytes = new Uint8Array(bin.length);
        for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
        append(stream, new TextDecoder("utf-8").decode(bytes));
      }
    };
  }
  es.addEventListener("status", function (e) {
    var d = JSON.parse(e.data);
    status.textContent = d.status;
    if (d.worker && worker) { worker.textContent = d.worker; }
  });
  // The call runs again (its worker was lost): its output starts over from byte 0.
  es.addEventListener("restart", function (e) {
    out.textContent = "";
    var note = document.getElementById("live-note");
    note.textContent = "";
    appendVisible(note, JSON.parse(e.data).message || "");
  });
  es.addEventListener("stdout", chunk("stdout"));
  es.addEventListener("stderr", chunk("stderr"));
  es.addEventListener("result", function (e) {
    es.close();
    var r = JSON.parse(e.data);
    status.textContent = r.status;
    if (r.exit_code !== undefined) { document.getElementById("exit-code").textContent = String(r.exit_code); }
    var form = document.getElementById("cancel-form");
    if (form) { form.remove(); }
    // The call's facts (finished, timing, usage, error) as the server renders them, from the page anew.
    fetch(window.location.pathname, { credentials: "same-origin" }).then(function (resp) {
      return resp.ok && !resp.redirected ? resp.text() : null;
    }).then(function (html) {
      var fresh = html && new DOMParser().parseFromString(html, "text/html").querySelector(".panel dl");
      if (fresh) { panel.querySelector("dl").replaceWith(document.importNode(fresh, true)); }
    }).catch(function () {});
    var note = document.getElementById("live-note");
    note.textContent = "The call ended " + r.status + ". ";
    var a = document.createElement("a");
    a.href = window.location.pathname;
    a.textContent = "Show the whole result";
    note.appendChild(a);
  });
  es.addEventListener("error", function (e) {
    if (e.data) { // the API's own error event: say it, and stop
      es.close();
      document.getElementById("live-note").textContent = "Following the output failed: ";
      appendVisible(document.getElementById("live-note"), JSON.parse(e.data).message || "");
    }
  });
}

document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-live]").forEach(liveList);
  document.querySelectorAll("[data-follow]").forEach(follow);
});
