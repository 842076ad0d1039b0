// Small behaviours of the portal pages, wired by data attributes (the Content-Security-Policy
// allows scripts from /static/ only: no inline handlers).
//   data-autosubmit   on a <select>: submit its form when the choice changes (tenant switcher)
//   data-select-all   on an <input>: select its text on click (a key shown once)
//   data-copy         on a <button> inside <details data-cli>: copy its commands to the clipboard
//   data-confirm-name on a submit button: enabled once the form's confirm_name equals the value
//                     (a convenience: the server checks the typed name itself)
//   a table or wrapper that scrolls sideways (390 px) gets tabindex="0", so a keyboard user
//   can scroll it (WCAG 2.1.1; axe's scrollable-region-focusable), again after htmx swaps
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el && el.hasAttribute && el.hasAttribute("data-autosubmit") && el.form) el.form.submit();
  });
  document.addEventListener("click", function (event) {
    var el = event.target;
    if (el && el.hasAttribute && el.hasAttribute("data-select-all") && el.select) el.select();
    if (el && el.hasAttribute && el.hasAttribute("data-copy")) {
      var box = el.closest("[data-cli]");
      var text = Array.prototype.map.call(box.querySelectorAll("pre"), function (p) {
        return p.textContent;
      }).join("\n");
      if (navigator.clipboard) navigator.clipboard.writeText(text).then(function () {
        el.textContent = "Copied";
      });
    }
  });
  function syncConfirm(input) {
    var form = input.form;
    if (!form) return;
    form.querySelectorAll("[data-confirm-name]").forEach(function (button) {
      button.disabled = input.value !== button.getAttribute("data-confirm-name");
    });
  }
  document.addEventListener("input", function (event) {
    var el = event.target;
    if (el && el.name === "confirm_name") syncConfirm(el);
  });
  function focusableScrollers() {
    document.querySelectorAll("table.list, .heatmap-wrap, .table-wrap").forEach(function (el) {
      if (el.scrollWidth > el.clientWidth + 1) {
        el.setAttribute("tabindex", "0");
        el.setAttribute("data-scrolls", "");
      } else if (el.hasAttribute("data-scrolls")) {
        el.removeAttribute("tabindex");
        el.removeAttribute("data-scrolls");
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll('input[name="confirm_name"]').forEach(syncConfirm);
    focusableScrollers();
  });
  document.addEventListener("htmx:afterSettle", focusableScrollers);
  window.addEventListener("resize", focusableScrollers);
})();
