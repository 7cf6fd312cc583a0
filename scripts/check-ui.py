"""Open a campaign in the MLflow UI with a real browser, check what a user sees, and save screenshots.

Run after a campaign (e.g. the main job), from the repository root:

    .venv/bin/python scripts/check-ui.py [--config configs/pipeline/default.yaml] [--out docs]

It serves the UI with ``r2s2r ui``, loads the page that command prints (the campaign's view) in
headless Chromium (Debian's ``chromium`` package), and checks the rendered page: the runs table
lists every iteration run, in order, with the headline columns, and the chart view's first section
is ``headline``, followed by one section per stage in flow order. It writes ``mlflow-runs.png``
and ``mlflow-charts.png`` to ``--out``, prints one JSON line with what it found, and exits with
status 1 if a check fails (2 if the campaign or the browser is missing).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from flows.stages import stage_names  # noqa: E402
from pipeline.config import load_all  # noqa: E402
from storage.layout import RunLayout  # noqa: E402
from storage.tracking import ITERATION_TAG, campaign_view_url, client_for  # noqa: E402


def browser() -> str:
    """The headless browser's command."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("check-ui: no Chromium found; install Debian's package: apt-get install chromium")


def render(chrome: str, url: str, screenshot: Path | None, height: int) -> str:
    """The page at ``url`` after its scripts ran (visible text), and its screenshot if asked."""
    common = [
        chrome,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--window-size=1800,{height}",
    ]
    common.append("--virtual-time-budget=30000")
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True).stdout
    if screenshot is not None:
        subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, timeout=180, check=True)
    text = html.unescape(re.sub(r"<[^>]+>", " ", dom))
    return re.sub(r"\s+", " ", text)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    """Until ``url`` answers (the UI server started); exit if the server stopped first."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if server.poll() is not None:
            sys.exit(f"check-ui: r2s2r ui stopped (status {server.returncode}) before answering at {url}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1.0)
    sys.exit(f"check-ui: the MLflow UI did not answer at {url} within {timeout_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/pipeline/default.yaml")
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--port", type=int, default=0, help="Port of the UI (default: a free one).")
    args = parser.parse_args()
    configs = load_all(args.config)
    client = client_for(RunLayout.of(configs))
    experiment = client.get_experiment_by_name(configs.pipeline.campaign)
    if experiment is None:
        print(
            f"check-ui: no MLflow experiment for campaign {configs.pipeline.campaign!r}; run it first", file=sys.stderr
        )
        sys.exit(2)
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.`{ITERATION_TAG}` LIKE '%'")
    iterations = [f"iter_{k}" for k in sorted(int(r.data.tags[ITERATION_TAG]) for r in runs)]
    headline = sorted({k for r in runs for k in r.data.metrics if k.startswith("headline/")})
    chrome = browser()
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    r2s2r = Path(sys.executable).parent / "r2s2r"
    command = [str(r2s2r), "ui", "--config", args.config, "--port", str(port)]
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_for(base, server, 120)
        page = campaign_view_url(base, experiment.experiment_id)
        args.out.mkdir(parents=True, exist_ok=True)
        table = render(chrome, page, args.out / "mlflow-runs.png", 800)
        charts = render(chrome, f"{page}&compareRunsMode=CHART", args.out / "mlflow-charts.png", 1300)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    shown = [name for name in re.findall(r"\biter_\d+\b", table) if name in iterations]
    sections = [name for name, _ in re.findall(r"\b([a-z_]+) \((\d+)\) Add chart", charts)]
    checks = {
        "campaign_shown": re.search(rf"Experiments\W+{re.escape(configs.pipeline.campaign)}\b", table) is not None,
        "iterations_listed_in_order": list(dict.fromkeys(shown)) == iterations,
        "headline_columns": bool(headline) and all(name in table for name in headline[:3]),
        "first_chart_section_is_headline": sections[:1] == ["headline"],
        "stage_sections_in_flow_order": [s for s in sections if s in stage_names()] == list(stage_names()),
    }
    print(json.dumps({"page": page, "iterations": iterations, "chart_sections": sections, "checks": checks}))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
