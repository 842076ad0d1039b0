// Usage chart: GPU-hours (bars, left axis) and cost (line, right axis) per day.
// Data comes from the page itself (json_script #usage-data); the table below the chart shows
// the same numbers without JavaScript.
(function () {
  "use strict";
  function draw() {
    var el = document.getElementById("usage-data");
    var canvas = document.getElementById("usage-chart");
    if (!el || !canvas || typeof Chart === "undefined") return;
    var data = JSON.parse(el.textContent);
    new Chart(canvas, {
      data: {
        labels: data.labels,
        datasets: [
          { type: "bar", label: "GPU-hours", data: data.gpu_hours, yAxisID: "hours",
            backgroundColor: "rgba(118, 185, 0, 0.75)" },
          { type: "line", label: "Cost (" + data.currency + ")", data: data.cost, yAxisID: "cost",
            borderColor: "#1f4e99", backgroundColor: "#1f4e99", tension: 0.2 },
        ],
      },
      options: {
        responsive: true, maintainAspectRatio: false, animation: false,
        interaction: { mode: "index", intersect: false },
        scales: {
          hours: { position: "left", beginAtZero: true, title: { display: true, text: "GPU-hours" } },
          cost: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false },
                  title: { display: true, text: data.currency } },
        },
      },
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
