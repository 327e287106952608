"""Viewer benchmark: many people open one job's page at once (issue 39).

    python benchmarks/viewer_requests.py sqlite:////tmp/views-stores/1000000.db --job 1 --requests 50

Starts a viewer on the store (read-only, in this process, as `posbias view` does) and sends `--requests`
GETs of `/job/JOB` at the same moment from as many threads; then one more GET, with nothing changed, and
one GET of a point's answers (`/api/answers`, position 1 of the job's first batch size) and of a trial
(`/api/trial`) that the page does not carry. It prints the time to the first and the last response, how many
times the page was built (the viewer's builder, counted), whether every response was the same page, its
size, and the process's CPU time (user + system) and peak memory. A page is built once per change of the
store, so the figure to read is `builds: 1`.
"""

from __future__ import annotations

import argparse
import json
import resource
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from posbias.service.reports.viewer import Viewer, open_read_only
from posbias.service.stats import queries


def _get(url: str) -> tuple[float, bytes]:
    with urllib.request.urlopen(url, timeout=3600) as answer:
        body = bytes(answer.read())
    return time.perf_counter(), body


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", help="the store's database URL")
    parser.add_argument("--job", type=int, default=1)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="the tokenizers' cache (POSBIAS_CACHE_DIR)"
    )
    args = parser.parse_args()

    cpu = time.process_time()
    with Viewer(open_read_only(args.url), cache_dir=args.cache_dir).start() as viewer:
        builds: list[float] = []
        lock = threading.Lock()
        build = viewer.build_report

        def counted(job_ids: list[int]) -> bytes:
            with lock:
                builds.append(time.perf_counter())
            return build(job_ids)

        viewer.build_report = counted  # type: ignore[method-assign]
        page = f"{viewer.url}job/{args.job}"
        start = time.perf_counter()
        with ThreadPoolExecutor(args.requests) as pool:
            answers = list(pool.map(lambda _: _get(page), range(args.requests)))
        times = sorted(t - start for t, _ in answers)
        bodies = {body for _, body in answers}
        first = time.perf_counter()
        _, body = _get(page)
        cached = time.perf_counter() - first
        size = queries.batch_sizes(viewer.db, job_ids=[args.job])[0]
        point = f"{viewer.url}api/answers/{args.job}?variant=baseline&batch={size}&axis=position&at=1"
        first = time.perf_counter()
        _, listed = _get(point)
        answers_s = time.perf_counter() - first
        first = time.perf_counter()
        trial = json.loads(listed)["rows"][-1][0]
        _get(f"{viewer.url}api/trial/{args.job}/{trial}")
        trial_s = time.perf_counter() - first
    used = time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.requests} parallel GETs of /job/{args.job}: "
        f"first response {times[0]:.1f} s, last {times[-1]:.1f} s"
    )
    print(f"builds: {len(builds)}; identical pages: {len(bodies) == 1}; page {len(body) / 1e6:.1f} MB")
    print(f"one more GET, nothing changed: {cached * 1000:.0f} ms")
    print(
        f"a point's answers (/api/answers): {answers_s * 1000:.0f} ms; "
        f"a trial (/api/trial): {trial_s * 1000:.0f} ms"
    )
    print(f"CPU (user + system) {used:.1f} s; peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    main()
