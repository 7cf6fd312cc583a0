"""The ``r2s2r`` command line.

Configs are validated before anything else happens; user mistakes (bad config,
bad data, hardware failure) print one readable message and exit with status 2,
without a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec

import typer
import yaml
from rich.console import Console
from rich.table import Table

from pipeline.config import LoadedConfigs, load_all
from pipeline.errors import ConfigError, DataError, R2S2RError
from pipeline.progress import PROGRESS_ENV
from storage.layout import RunLayout
from storage.live import DEFAULT_LIVE_ADDRESS

app = typer.Typer(
    help="R2S2R: Real2Sim2Real pipeline for cable-driven tensegrity robots.", no_args_is_help=True, add_completion=False
)
console = Console(stderr=True)

ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="Pipeline config (YAML).")]
IterationOption = Annotated[int, typer.Option("--iteration", "-k", min=1, help="Iteration number (1-based).")]
SetOption = Annotated[list[str] | None, typer.Option("--set", help="Override a config value: key.path=value (YAML).")]
ImportCampaignOption = Annotated[
    str | None, typer.Option("--campaign", help="Campaign to import into (default: the config's).")
]
LiveOption = Annotated[
    bool,
    typer.Option("--live", help="Serve each run live on Foxglove's WebSocket while the robot runs (docs/foxglove.md)."),
]
LiveAddressOption = Annotated[
    str, typer.Option("--live-address", help="HOST:PORT of the live server (another host than 127.0.0.1 opens it).")
]
DEFAULT_CONFIG = Path("configs/pipeline/default.yaml")
_COMMAND_LINE: list[str] = []
"""The arguments :func:`main` was given: a command that reads a runs folder's configs hands them to
its command server (:mod:`flows.command_server`) where one runs; empty when the app is called
otherwise (tests' in-process runner)."""
P = ParamSpec("P")


@app.callback()
def show_progress(
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="Progress rows of the long stages on stderr where it is not a terminal too (--no-progress: never; "
            "default: on a terminal). Each stage's closing line is printed either way.",
        ),
    ] = None,
) -> None:
    """Set :data:`~pipeline.progress.PROGRESS_ENV` for the command (and the task runners' workers it starts)."""
    if progress is not None:
        os.environ[PROGRESS_ENV] = "1" if progress else "0"


def _serve_live(live: bool, address: str) -> None:
    """With ``live``, have every recording this command makes served at ``address`` (:mod:`storage.live`)."""
    if live:
        from storage.live import LIVE_ENV, parse_address

        parse_address(address)
        os.environ[LIVE_ENV] = address


def parse_overrides(items: list[str] | None) -> dict[str, object]:
    """``["collect.random.seed=3"]`` -> ``{"collect.random.seed": 3}`` (values parsed as YAML)."""
    out: dict[str, object] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = " ".join(str(exc).split())
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({problem})") from None
    return out


def user_errors(command: Callable[P, None]) -> Callable[P, None]:
    """Turn pipeline errors into one red line and exit status 2 (130 on Ctrl-C)."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except R2S2RError as exc:
            console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print("[bold yellow]interrupted[/]: recorded data was kept and marked incomplete")
            raise typer.Exit(130) from None

    return wrapper


def _load(config: Path, overrides: dict[str, object], create: bool = True, flows: bool = False) -> LoadedConfigs:
    """The configs, with the process environment set for them (:mod:`flows.environment`) and,
    unless ``create`` is false, the runs folder created. With ``flows`` (a command that runs
    Prefect flows) Prefect is pointed at the runs folder's shared local server
    (:mod:`flows.local_server`). A command started by :func:`main` is then handed to the runs
    folder's command server where one runs (:mod:`flows.command_server`): this process exits with
    its status."""
    configs = load_all(config, overrides)
    from flows.environment import configure_environment

    layout = RunLayout.of(configs)
    configure_environment(layout)
    if create:
        layout.runs_dir.mkdir(parents=True, exist_ok=True)
    prefect_home = Path(os.environ["PREFECT_HOME"])
    if flows:
        from flows.local_server import connect

        connect(prefect_home)
    if _COMMAND_LINE and (create or prefect_home.is_dir()):
        from flows.command_server import delegate

        if (status := delegate(prefect_home, _COMMAND_LINE)) is not None:
            raise typer.Exit(status)
    return configs


def _run_iteration(
    config: Path,
    iteration: int,
    overrides: dict[str, object],
    stages: list[str] | None,
    refresh: list[str] | None = None,
    hardware: bool = True,
) -> None:
    configs = _load(config, overrides, flows=True)
    from flows.iteration import r2s2r_iteration, with_runner

    flow = with_runner(r2s2r_iteration, configs)
    summary = flow(str(config.resolve()), iteration, overrides, stages, refresh, hardware)
    table = Table(title=f"{configs.pipeline.campaign} iteration {iteration}")
    for column in ("stage", "output", "cached", "wall s"):
        table.add_column(column)
    for stage, info in summary["stages"].items():
        if "skipped" in info:
            table.add_row(stage, f"[yellow]not run: {info['skipped']}[/]", "", "")
        else:
            wall = f"{info['wall_s']:.1f}" if "wall_s" in info else ""
            table.add_row(stage, info["ref"]["path"], "yes" if info["cached"] else "no", wall)
    Console().print(table)
    Console().print(f"MLflow run: {summary['mlflow_run_id']}  (view with: r2s2r ui --config {config})")


@app.command()
@user_errors
def collect(
    config: ConfigOption = DEFAULT_CONFIG,
    iteration: IterationOption = 1,
    set_: SetOption = None,
    live: LiveOption = False,
    live_address: LiveAddressOption = DEFAULT_LIVE_ADDRESS,
) -> None:
    """Run the collect stage: execute the configured policy on the hardware and record it."""
    _serve_live(live, live_address)
    _run_iteration(config, iteration, parse_overrides(set_), ["collect"])


@app.command()
@user_errors
def iterate(
    config: ConfigOption = DEFAULT_CONFIG,
    iteration: IterationOption = 1,
    set_: SetOption = None,
    live: LiveOption = False,
    live_address: LiveAddressOption = DEFAULT_LIVE_ADDRESS,
) -> None:
    """Run one R2S2R iteration (every stage implemented so far), reusing cached stages."""
    _serve_live(live, live_address)
    _run_iteration(config, iteration, parse_overrides(set_), None)


@app.command()
@user_errors
def rerun(
    stage: Annotated[str, typer.Argument(help="The stage to recompute (collect, track, attach, sysid, ...).")],
    config: ConfigOption = DEFAULT_CONFIG,
    iteration: IterationOption = 1,
    set_: SetOption = None,
    recollect: Annotated[
        bool, typer.Option("--recollect", help="Let the stages that drive the hardware (collect, redeploy) run.")
    ] = False,
    live: LiveOption = False,
    live_address: LiveAddressOption = DEFAULT_LIVE_ADDRESS,
) -> None:
    """Recompute STAGE of iteration K and what depends on it, reusing cached upstream results.

    The hardware never runs again unless --recollect is given: the recording is kept, and
    redeploy and evaluate (which need the robot to run the new gaits) are left stale.
    """
    overrides = parse_overrides(set_)
    _serve_live(live, live_address)
    _load(config, overrides, flows=True)  # before flows.stages imports Prefect: its home is the runs folder's
    from flows.stages import hardware_stages, stage_names

    if stage not in stage_names():
        raise ConfigError(f"rerun {stage!r}: unknown stage; expected one of {', '.join(stage_names())}")
    if stage in hardware_stages() and not recollect:
        raise ConfigError(f"rerun {stage}: this stage drives the hardware; pass --recollect to run it again")
    _run_iteration(config, iteration, overrides, None, [stage], recollect)


@app.command()
@user_errors
def campaign(
    config: ConfigOption = DEFAULT_CONFIG,
    iterations: Annotated[int, typer.Option("--iterations", "-n", min=1, help="How many iterations.")] = 2,
    set_: SetOption = None,
    live: LiveOption = False,
    live_address: LiveAddressOption = DEFAULT_LIVE_ADDRESS,
) -> None:
    """Run iterations 1..N of the campaign (cached stages reused); print the headline metrics."""
    overrides = parse_overrides(set_)
    _serve_live(live, live_address)
    configs = _load(config, overrides, flows=True)
    from flows.campaign import r2s2r_campaign

    result = r2s2r_campaign(str(config.resolve()), iterations, overrides)
    rows = {item["iteration"]: item["headline"] for item in result["iterations"]}
    Console().print(_headline_table(f"campaign {configs.pipeline.campaign}", rows))
    Console().print(f"MLflow campaign run: {result['campaign_run_id']}  (view with: r2s2r ui --config {config})")


def _summary_table(title: str, summary: dict[str, object]) -> Table:
    """A stage's or command's figures, one row each (floats to three decimals)."""
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value")
    for key, value in summary.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    return table


def _headline_table(title: str, rows: dict[int, dict[str, float]]) -> Table:
    """Headline figures (rows, in :data:`storage.tracking.HEADLINE`'s order) by iteration (columns),
    so that a terminal fits many iterations."""
    table = Table(title=title)
    iterations = sorted(rows)
    table.add_column("metric", no_wrap=True)
    for iteration in iterations:
        table.add_column(f"iteration {iteration}", justify="right")
    from storage.tracking import headline_order

    for metric in sorted({key for metrics in rows.values() for key in metrics}, key=headline_order):
        values = [rows[k].get(metric) for k in iterations]
        table.add_row(metric, *("" if v is None else f"{v:.4g}" for v in values))
    return table


@app.command()
@user_errors
def compare(
    campaign_name: Annotated[str | None, typer.Argument(help="Campaign (default: the config's).")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Print the campaign's iterations side by side: the headline figures of their MLflow runs."""
    configs = _load(config, {} if campaign_name is None else {"campaign": campaign_name}, create=False)
    from storage.tracking import HEADLINE_PREFIX, ITERATION_TAG, client_for, is_server_uri, tracking_uri

    layout = RunLayout.of(configs)
    uri = tracking_uri(layout)
    no_runs = f"campaign '{configs.pipeline.campaign}' has no runs"
    if not is_server_uri(uri) and not layout.mlflow_db.is_file():  # opening it would create it
        raise DataError(f"{layout.mlflow_db}: {no_runs} (no MLflow database there)")
    client = client_for(layout)
    experiment = client.get_experiment_by_name(configs.pipeline.campaign)
    if experiment is None:
        raise DataError(f"{uri}: {no_runs}")
    rows = {
        int(run.data.tags[ITERATION_TAG]): {k: v for k, v in run.data.metrics.items() if k.startswith(HEADLINE_PREFIX)}
        for run in client.search_runs([experiment.experiment_id])
        if ITERATION_TAG in run.data.tags
    }
    Console().print(_headline_table(f"campaign {configs.pipeline.campaign}", rows))


@app.command()
@user_errors
def status(
    config: ConfigOption = DEFAULT_CONFIG,
    set_: SetOption = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Hash every file against its manifest (else size and time only).")
    ] = False,
) -> None:
    """Show, per iteration and stage, whether the output is cached, stale, missing or corrupt under this config."""
    configs = _load(config, parse_overrides(set_))
    from flows.stages import stage_names
    from flows.status import iterations_on_disk, stage_status

    layout = RunLayout.of(configs)
    table = Table(title=f"campaign {configs.pipeline.campaign}: stage outputs under this config")
    table.add_column("stage")
    iterations = iterations_on_disk(layout)
    for iteration in iterations:
        table.add_column(f"iteration {iteration}")
    colour = {"cached": "green", "stale": "yellow", "missing": "red", "corrupt": "bold red"}
    problems: dict[int, dict[str, str]] = {iteration: {} for iteration in iterations}
    states = {iteration: stage_status(configs, iteration, verify, problems[iteration]) for iteration in iterations}
    for stage in stage_names():
        table.add_row(stage, *(f"[{colour[states[k][stage]]}]{states[k][stage]}[/]" for k in iterations))
    console = Console()
    console.print(table)
    for iteration, found in problems.items():
        for stage, problem in found.items():
            console.print(f"iteration {iteration} {stage}: corrupt: {problem}", markup=False, highlight=False)


@app.command("export-mcap")
@user_errors
def export_mcap(
    stage: Annotated[str, typer.Argument(help="The stage whose recordings to export: collect, redeploy or follow.")] = (
        "collect"
    ),
    iteration: IterationOption = 1,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="A folder, or the .mcap file where one recording is exported (default: the exports folder).",
        ),
    ] = None,
    recording: Annotated[str | None, typer.Option("--recording", help="Only this recording (its folder name).")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
    set_: SetOption = None,
) -> None:
    """Export each recording of a stage of iteration K as an MCAP file for Foxglove (docs/foxglove.md)."""
    configs = _load(config, parse_overrides(set_), create=False)
    from storage.mcap_export import export_stage

    exports = export_stage(RunLayout.of(configs), configs.robot, iteration, stage, out, recording)
    table = Table(title=f"{configs.pipeline.campaign} iteration {iteration} {stage}: MCAP files")
    for column in ("file", "messages", "seconds"):
        table.add_column(column)
    for export in exports:
        table.add_row(str(export.path), str(sum(export.messages.values())), f"{export.end_s - export.start_s:.1f}")
    Console().print(table)


def _import(
    config: Path,
    overrides: dict[str, object],
    campaign: str | None,
    iteration: int,
    source: Path,
    run: Callable[[LoadedConfigs], tuple[object, dict[str, object]]],
) -> None:
    """Load the configs (into ``campaign`` if given), import with ``run`` and print its report."""
    if campaign is not None:
        overrides = {**overrides, "campaign": campaign}
    configs = _load(config, overrides)
    ref, summary = run(configs)
    Console().print(_summary_table(f"import {source} -> {configs.pipeline.campaign} iteration {iteration}", summary))
    Console().print(f"stage output: {ref.path}")


@app.command("import-tribar")
@user_errors
def import_tribar(
    src: Annotated[Path, typer.Argument(help="Tribar recording folder: color/, depth/, data/, config.json.")],
    campaign: ImportCampaignOption = None,
    config: ConfigOption = DEFAULT_CONFIG,
    iteration: IterationOption = 1,
    extrinsics: Annotated[
        str,
        typer.Option(help="What config.json's cam_extr maps: camera_to_world or world_to_camera (see README)."),
    ] = "camera_to_world",
    min_share: Annotated[
        float,
        typer.Option("--min-share", help="Refuse the import when fewer than this share of the frames are usable."),
    ] = 0.9,
    set_: SetOption = None,
) -> None:
    """Import a real recording (Tribar layout) as iteration K's collect stage, then print the report."""
    overrides = parse_overrides(set_)
    if extrinsics not in ("camera_to_world", "world_to_camera"):
        raise ConfigError(f"--extrinsics {extrinsics!r}: expected camera_to_world or world_to_camera")
    if not 0.0 <= min_share <= 1.0:
        raise ConfigError(f"--min-share {min_share}: expected a share between 0 and 1")
    from storage.tribar import Extrinsics
    from tasks.import_recording import run_import

    _import(
        config,
        overrides,
        campaign,
        iteration,
        src,
        lambda c: run_import(c, iteration, src, Extrinsics(extrinsics), min_share),
    )


@app.command("import-r2s2r")
@user_errors
def import_r2s2r(
    path: Annotated[Path, typer.Argument(help="A processed_data.json of the R2S2R paper's code.")],
    campaign: ImportCampaignOption = None,
    config: ConfigOption = DEFAULT_CONFIG,
    iteration: IterationOption = 1,
    set_: SetOption = None,
) -> None:
    """Import a processed trajectory of the R2S2R paper's code as iteration K's collect stage (end
    caps as given, no frames), then print the report."""
    from tasks.import_recording import run_import_published

    _import(
        config, parse_overrides(set_), campaign, iteration, path, lambda c: run_import_published(c, iteration, path)
    )


@app.command("import-bag")
@user_errors
def import_bag(
    bag: Annotated[
        Path, typer.Argument(help="A ROS 1 .bag file or a ROS 2 bag folder; topics: the config's bag_import.")
    ],
    campaign: ImportCampaignOption = None,
    config: ConfigOption = DEFAULT_CONFIG,
    iteration: IterationOption = 1,
    set_: SetOption = None,
) -> None:
    """Import a robot's ROS 1 or ROS 2 bag as iteration K's collect stage, then print the report."""
    from tasks.import_recording import run_import_bag

    _import(config, parse_overrides(set_), campaign, iteration, bag, lambda c: run_import_bag(c, iteration, bag))


@app.command()
@user_errors
def follow(
    path: Annotated[
        str,
        typer.Argument(
            help="The path: a built-in, line[:length_m], arc[:radius_m[:sweep_deg]] (counter-clockwise; a "
            "negative sweep turns clockwise) or triangle[:leg_m], or a YAML or CSV file of x, y waypoints "
            "(m, world frame)."
        ),
    ],
    config: ConfigOption = DEFAULT_CONFIG,
    iteration: IterationOption = 1,
    set_: SetOption = None,
    live: LiveOption = False,
    live_address: LiveAddressOption = DEFAULT_LIVE_ADDRESS,
) -> None:
    """Follow PATH on the hardware, closed loop, with iteration K's action table (docs/follow.md)."""
    _serve_live(live, live_address)
    configs = _load(config, parse_overrides(set_))
    from tasks.follow import follow_and_log

    folder, summary = follow_and_log(configs, iteration, path)
    Console().print(_summary_table(f"follow {path}: {configs.pipeline.campaign} iteration {iteration}", summary))
    Console().print(f"recorded in {folder}")


@app.command("serve-twin")
@user_errors
def serve_twin(
    config: ConfigOption = DEFAULT_CONFIG,
    port: Annotated[int, typer.Option(min=1, max=65534, help="Command port; telemetry on PORT + 1.")] = 5555,
    host: Annotated[str, typer.Option(help="Address to bind (another than 127.0.0.1 opens it to the network).")] = (
        "127.0.0.1"
    ),
    speed: Annotated[
        float, typer.Option(min=0, help="Robot seconds per wall second; 1 runs in real time as a robot, 0 unpaced.")
    ] = 1.0,
    watchdog_s: Annotated[float, typer.Option(min=0.1, help="Stop a run when the client is silent this long (s).")] = 5,
    truth: Annotated[bool, typer.Option(help="Stream the simulator's ground truth (--no-truth: as a real robot).")] = (
        True
    ),
    drop_at_s: Annotated[
        float | None, typer.Option(help="Fault: close the link this long after the first run starts (s).")
    ] = None,
    drop_for_s: Annotated[float, typer.Option(min=0, help="Fault: ... for this long (s).")] = 2.0,
    delay_s: Annotated[float, typer.Option(min=0, help="Fault: delay every message by this much (s).")] = 0.0,
    loss: Annotated[float, typer.Option(min=0, max=1, help="Fault: lose this share of the messages.")] = 0.0,
    reorder: Annotated[
        float, typer.Option(min=0, max=1, help="Fault: hold back this share of the messages 50 ms (out of order).")
    ] = 0.0,
    protocol_version: Annotated[
        int | None, typer.Option(help="Fault: speak this protocol version instead of the current one.")
    ] = None,
    set_: SetOption = None,
) -> None:
    """Serve the MuJoCo twin of the config's hardware_config over the robot protocol
    (docs/robot-protocol.md) until Ctrl-C or SIGTERM: a campaign with hardware_backend: network
    runs on it as on a robot. The fault options put a bad network between the two, for testing."""
    import logging

    from pipeline.hardware.protocol import PROTOCOL_VERSION
    from pipeline.hardware.server import TwinServer, WireFaults
    from pipeline.hardware.twin import MujocoTwin

    configs = load_all(config, parse_overrides(set_))
    if configs.twin is None:
        raise ConfigError(f"{config}: serve-twin serves the twin of hardware_config, and the config names none")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    faults = WireFaults(drop_at_s=drop_at_s, drop_for_s=drop_for_s, delay_s=delay_s, loss=loss, reorder=reorder)
    server = TwinServer(
        MujocoTwin(configs.robot, configs.twin),
        host=host,
        port=port,
        speed=speed,
        watchdog_s=watchdog_s,
        faults=faults,
        version=PROTOCOL_VERSION if protocol_version is None else protocol_version,
        truth=truth,
    )
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve(lambda: stopping)


@app.command()
@user_errors
def ui(
    config: ConfigOption = DEFAULT_CONFIG, port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 5000
) -> None:
    """Serve the MLflow UI for the campaign's runs on http://127.0.0.1:PORT and print the page of the
    campaign's view: its iterations with their headline columns, charts headline first (with
    MLFLOW_TRACKING_URI set to a tracking server: say where that server's UI is)."""
    configs = _load(config, {})
    from storage.tracking import campaign_view_url, client_for, is_server_uri, tracking_uri

    layout = RunLayout.of(configs)
    uri = tracking_uri(layout)
    experiment = client_for(layout).get_experiment_by_name(configs.pipeline.campaign)
    if is_server_uri(uri):  # MLFLOW_TRACKING_URI: a tracking server serves its own UI
        where = campaign_view_url(uri.rstrip("/"), experiment.experiment_id) if experiment else uri
        console.print(f"the runs are on the MLflow server {uri}: its UI is there, the campaign at {where}")
        return
    base = f"http://127.0.0.1:{port}"
    page = campaign_view_url(base, experiment.experiment_id) if experiment else base
    console.print(f"MLflow UI on {base}; campaign {configs.pipeline.campaign}: {page} (Ctrl-C to stop)", soft_wrap=True)
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1"]
    _serve_until_stopped([*command, "--port", str(port)], env)


def _serve_until_stopped(command: list[str], env: dict[str, str]) -> None:
    """Run ``command`` (a server) in a process group of its own until it exits, or until this
    process gets Ctrl-C or SIGTERM: then the whole group (the server and its workers) is
    stopped, so nothing is left holding the port."""
    server = subprocess.Popen(command, env=env, start_new_session=True)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.wait()
    except KeyboardInterrupt:
        console.print("stopping the server")
    finally:
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _prefect_command() -> str:
    """``prefect`` if that is this environment's, else the full path of this environment's (the worker
    must run in the environment that has the pipeline installed)."""
    import shutil

    mine = Path(sys.executable).parent / "prefect"
    found = shutil.which("prefect")
    return "prefect" if found is not None and Path(found).resolve() == mine.resolve() else str(mine)


@app.command()
@user_errors
def deploy(
    config: ConfigOption = DEFAULT_CONFIG,
    iterations: Annotated[int, typer.Option("--iterations", "-n", min=1, help="Iterations per run.")] = 1,
    pool: Annotated[str, typer.Option("--pool", help="Prefect work pool (process; created if missing).")] = "r2s2r",
    name: Annotated[str | None, typer.Option("--name", help="Deployment name (default: the campaign).")] = None,
    stages: Annotated[
        str | None, typer.Option("--stages", help="Comma-separated stages each iteration runs (default: all).")
    ] = None,
    set_: SetOption = None,
) -> None:
    """Create or update a Prefect deployment of the campaign flow on a running Prefect server (server mode)."""
    overrides = parse_overrides(set_)
    configs = _load(config, overrides)
    from flows.deploy import deploy_campaign

    wanted = None if stages is None else [s.strip() for s in stages.split(",") if s.strip()]
    info = deploy_campaign(config, iterations, overrides, name or configs.pipeline.campaign, pool, wanted)
    prefect = _prefect_command()
    out = Console(highlight=False, soft_wrap=True, markup=False)
    out.print(f"deployment '{info.full_name}' id {info.deployment_id}")
    out.print(f"work pool '{info.pool}' (process{', created' if info.pool_created else ''}) on {info.api_url}")
    out.print(f"parameters: {info.parameters}")
    mlflow = info.mlflow_tracking_uri or "the local store under the runs folder (MLFLOW_TRACKING_URI unset)"
    out.print(f"MLflow: {mlflow}")
    out.print("start a worker (in this folder, PREFECT_API_URL exported):")
    out.print(f"  {prefect} worker start --pool {info.pool}")
    out.print("trigger a run:")
    out.print(f"  {prefect} deployment run '{info.full_name}'")
    out.print(f"watch it: Prefect UI {info.ui_url}")


def main(prog_name: str | None = None) -> None:
    """Console-script entry point (``prog_name``: the program's name in usage lines, where the
    process's own name is not it)."""
    _COMMAND_LINE[:] = sys.argv[1:]
    app(prog_name=prog_name)
