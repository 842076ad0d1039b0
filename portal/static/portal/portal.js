// Small behaviours of the portal pages, wired by data attributes (the Content-Security-Policy
// allows scripts from /static/ only: no inline handlers).
//   data-autosubmit   on a <select>: submit its form when the choice changes (tenant switcher)
//   data-select-all   on an <input>: select its text on click (a key shown once)
(function () {
  "use strict";
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el && el.hasAttribute && el.hasAttribute("data-autosubmit") && el.form) el.form.submit();
  });
  document.addEventListener("click", function (event) {
    var el = event.target;
    if (el && el.hasAttribute && el.hasAttribute("data-select-all") && el.select) el.select();
  });
})();
