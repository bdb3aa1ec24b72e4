// The overview's live rates: /rates.json every 2 s into four lines of a Chart.js chart (static/vendor),
// and its alerts list kept current from the same answer.
(function () {
  const canvas = document.getElementById("rates-chart");
  if (!canvas || typeof Chart === "undefined") { return; }
  const series = [["produce_bytes", "produced B/s", "#0969da", "y"], ["fetch_bytes", "fetched B/s", "#8250df", "y"],
                  ["committed", "committed/s", "#1a7f37", "y1"], ["aborted", "aborted/s", "#cf222e", "y1"]];
  const chart = new Chart(canvas, {
    type: "line",
    data: {labels: [], datasets: series.map(([, label, color, axis]) => ({label, data: [], borderColor: color,
                                                                          yAxisID: axis, pointRadius: 0}))},
    options: {animation: false, responsive: true, maintainAspectRatio: false,
              scales: {y: {beginAtZero: true, position: "left", title: {display: true, text: "bytes/s"}},
                       y1: {beginAtZero: true, position: "right", title: {display: true, text: "transactions/s"},
                            grid: {drawOnChartArea: false}}}},
  });
  const status = document.getElementById("rates-status");
  async function poll() {
    try {
      const answer = await fetch("/rates.json", {headers: {"Accept": "application/json"}});
      const sample = await answer.json();
      if (sample.rates.produce_bytes !== null) {
        chart.data.labels.push(new Date().toLocaleTimeString());
        series.forEach(([name], i) => chart.data.datasets[i].data.push(sample.rates[name]));
        if (chart.data.labels.length > 90) {
          chart.data.labels.shift();
          chart.data.datasets.forEach((d) => d.data.shift());
        }
        chart.update();
      }
      status.textContent = sample.unreachable.length ? "not answering: " + sample.unreachable.join(", ") : "";
      showAlerts(sample);
    } catch (failure) {
      status.textContent = "the console does not answer";
    }
  }
  function showAlerts(sample) {  // the alerts list kept current with each sample (text only, never HTML)
    const list = document.getElementById("alerts");
    if (!list) { return; }
    const items = sample.alerts.map((a) => {
      const item = document.createElement("li");
      item.className = a.severity === "critical" ? "bad" : "warn";
      const name = document.createElement("b");
      name.textContent = a.alert;
      item.append(name, " (" + a.severity + "): " + a.summary);
      return item;
    });
    if (!items.length) {
      const calm = document.createElement("li");
      calm.className = sample.answered ? "good" : "warn";
      calm.textContent = sample.answered ? "None of the chart's alerts would fire now."
        : "No metrics endpoint answered: what the alerts would say is unknown.";
      items.push(calm);
    }
    sample.unreachable.forEach((url) => {
      const item = document.createElement("li");
      item.className = "warn";
      item.textContent = url + " does not answer";
      items.push(item);
    });
    list.replaceChildren(...items);
  }
  async function every2s() {  // the next ask only once the last is answered: slow answers do not pile up
    await poll();
    setTimeout(every2s, 2000);
  }
  every2s();
})();
