"""Settings of the list benchmark's server: NVKE's, plus the bare views' URLs."""

from nvke.settings import *  # noqa: F403

ROOT_URLCONF = "tests.bench.bench_urls"
