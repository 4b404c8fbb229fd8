/* padoc-ray Serve page view: upload a document (or name a job), draw each parsed page with PadocPage.
 * Every data call goes to the /v1 API under the page's root path, with the bearer token kept in
 * sessionStorage; the token is asked for on the first 401 (and again on a later one). */
(function () {
  "use strict";
  var root = document.body.dataset.root || "";
  var KEY = "padoc-ray-token";
  var tokenForm = document.getElementById("pd-token");
  var statusEl = document.getElementById("pd-status");
  var pagesEl = document.getElementById("pd-pages");
  var waiting = [];  // calls waiting for the token

  function say(text, bad) {
    statusEl.textContent = text;
    statusEl.classList.toggle("pd-bad", !!bad);
  }

  function askToken() {
    tokenForm.hidden = false;
    tokenForm.elements.token.focus();
    say("this service needs its API token");
    return new Promise(function (resolve) { waiting.push(resolve); });
  }

  tokenForm.addEventListener("submit", function (e) {
    e.preventDefault();
    sessionStorage.setItem(KEY, tokenForm.elements.token.value.trim());
    tokenForm.reset();
    tokenForm.hidden = true;
    var go = waiting;
    waiting = [];
    go.forEach(function (resolve) { resolve(); });
  });

  function call(method, path, body) {
    var token = sessionStorage.getItem(KEY);
    var headers = token ? {"Authorization": "Bearer " + token} : {};
    return fetch(root + path, {method: method, headers: headers, body: body}).then(function (r) {
      if (r.status === 401) {
        sessionStorage.removeItem(KEY);
        return askToken().then(function () { return call(method, path, body); });
      }
      return r.json().then(function (data) {
        if (!r.ok) {
          var err = data && data.error ? data.error.code + ": " + data.error.message : "HTTP " + r.status;
          throw new Error(err);
        }
        return data;
      });
    });
  }

  function show(result) {
    pagesEl.textContent = "";
    var d = result.document;
    say(d.name + ": " + result.status + ", " + d.pages_ok + " of " + d.pages_selected + " pages ok");
    result.pages.forEach(function (p) {
      var sec = document.createElement("section");
      sec.className = "pd-page";
      sec.dataset.page = p.page_index;
      var h = document.createElement("h2");
      h.textContent = "page " + (p.page_index + 1) + ": " + p.status + (p.error_code ? " (" + p.error_code + ")" : "");
      var holder = document.createElement("div");
      sec.appendChild(h);
      sec.appendChild(holder);
      pagesEl.appendChild(sec);
      var row = Object.assign({}, p);
      delete row.view;
      PadocPage.render(holder, Object.assign({}, p.view, {row: row}));
    });
  }

  function run(promise) {
    say("working...");
    pagesEl.textContent = "";
    promise.then(show, function (e) { say(String(e.message || e), true); });
  }

  document.getElementById("pd-upload").addEventListener("submit", function (e) {
    e.preventDefault();
    var body = new FormData();
    body.append("file", e.target.elements.file.files[0]);
    run(call("POST", "/v1/parse?view=true", body));
  });

  document.getElementById("pd-job").addEventListener("submit", function (e) {
    e.preventDefault();
    var id = e.target.elements.job.value.trim();
    run(call("GET", "/v1/jobs/" + encodeURIComponent(id) + "/result?view=true"));
  });
})();
