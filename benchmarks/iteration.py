"""Wall time of the README's main job: one R2S2R iteration on the twin, from a shell.

Runs ``scripts/run-main.sh`` (set-up check + ``r2s2r iterate``) in a fresh campaign
under a temporary runs folder, twice: the first run executes the hardware, the
second must hit the collect cache. Prints one JSON object (last line): wall times
in seconds and, as the anchor measured in the same run, the wall time of a bare
``r2s2r --help`` (interpreter + imports, no work).

Usage: ``python -m benchmarks.iteration [--quick]`` (``--quick``: a 2-target
random policy instead of the configured one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 2-target policy (under a minute)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="r2s2r-bench-") as tmp:
        sets = ["--set", f"runs_dir={tmp}/runs", "--set", "campaign=bench"]
        if args.quick:
            sets += ["--set", "collect.random.n_targets=2"]
        main_job = ["bash", "scripts/run-main.sh", *sets]
        first = _timed(main_job)
        cached = _timed(main_job)
        manifest = json.loads((Path(tmp) / "runs" / "bench" / "iter_1" / "collect" / "manifest.json").read_text())
    anchor = _timed([str(REPO / ".venv" / "bin" / "r2s2r"), "--help"])
    print(
        json.dumps(
            {
                "main_job_wall_s": first,
                "main_job_cached_wall_s": cached,
                "anchor_cli_help_wall_s": anchor,
                "collect_robot_time_s": manifest["summary"]["duration_s"],
                "collect_frames": manifest["summary"]["n_frames"],
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
