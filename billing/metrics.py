"""Billing metrics for ``/metrics`` (:mod:`nvke.metrics`), for operators to alert on.

* ``nvke_invoice_build_failures_total{code, gpu_model, currency}`` — invoice builds the billing
  worker could not finish, by the problem's code: ``missing_price`` names the GPU model and
  currency that have usage but no price (the usage the console's invoices page lists). Alert
  on ``increase(nvke_invoice_build_failures_total[1h]) > 0``; the worker also logs one ERROR
  line ``invoice_build_failed`` per failure (tenant, month, model, currency), no traceback.

Counted per process (multiprocess-safe with ``PROMETHEUS_MULTIPROC_DIR``). Labels are bounded:
codes are the billing problems' codes, models the catalog's slugs, currencies ISO codes.
"""

from __future__ import annotations

from prometheus_client import Counter

INVOICE_BUILD_FAILURES = Counter(
    "nvke_invoice_build_failures",
    "Invoice builds the billing worker could not finish",
    ["code", "gpu_model", "currency"],
)
