// airgate compliance console: the copy button of a new key (the page works without it:
// the key sits in a read-only field to select and copy by hand).  No inline script anywhere.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-select-on-focus]").forEach(function (field) {
    field.addEventListener("focus", function () { field.select(); });
  });
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    button.addEventListener("click", function () {
      var field = document.getElementById(button.getAttribute("data-copy"));
      var status = button.parentElement.querySelector(".copied");
      if (!field) { return; }
      field.focus();
      field.select();
      var done = function (ok) { if (status) { status.textContent = ok ? "Copied" : "Press Ctrl+C to copy"; } };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(field.value).then(function () { done(true); },
                                                        function () { done(false); });
      } else {
        var ok = false;
        try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
        done(ok);
      }
    });
  });
});
