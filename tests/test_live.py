"""A collect run served live on Foxglove's WebSocket (``--live``), read by a WebSocket client."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from websockets.sync.client import connect

from pipeline.config import load_all
from pipeline.errors import ConfigError
from storage.live import LIVE_ENV, parse_address, stop_live
from tasks.collect import run_collect

from .conftest import write_test_pipeline


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_collect_run_is_served_live_on_the_foxglove_websocket(tmp_path, monkeypatch) -> None:
    """While the twin runs a two-target policy, a client of the Foxglove WebSocket protocol sees the
    scene's channels advertised and receives sensor samples on ``/sensors`` (JSON, the recording's
    fields) before the run ends."""
    port = _free_port()
    monkeypatch.setenv(LIVE_ENV, f"127.0.0.1:{port}")
    configs = load_all(write_test_pipeline(tmp_path, campaign="live", n_targets=2))
    done = threading.Event()
    failures: list[BaseException] = []

    def collect() -> None:
        try:
            run_collect(configs, 1)
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    runner = threading.Thread(target=collect)
    runner.start()
    try:
        for _ in range(600):  # the server starts with the first recording
            try:
                client = connect(f"ws://127.0.0.1:{port}", subprotocols=["foxglove.sdk.v1"], open_timeout=1)
                break
            except OSError:
                done.wait(0.05)
        else:
            pytest.fail("the live server did not start")
        with client:
            topics: dict[str, int] = {}
            while "/sensors" not in topics or "/robot/truth" not in topics:
                message = json.loads(client.recv(timeout=30))
                if message.get("op") == "advertise":
                    topics.update({c["topic"]: c["id"] for c in message["channels"]})
            assert {"/sensors", "/robot/truth", "/ground"} <= set(topics)
            client.send(json.dumps({"op": "subscribe", "subscriptions": [{"id": 1, "channelId": topics["/sensors"]}]}))
            while True:
                data = client.recv(timeout=30)
                if isinstance(data, bytes) and data[0] == 1:  # message data: op, subscription id, time, payload
                    sample = json.loads(data[1 + 4 + 8 :])
                    break
        assert set(sample) == {"t_s", "segment", "target", "control", "cable_m", "motor_rad"}
        assert len(sample["cable_m"]) == 9 and not done.is_set()  # live: the run was still going
    finally:
        runner.join()
        stop_live()
    assert failures == []


@pytest.mark.parametrize("address", ["8765", "localhost:", ":8765", "host:99999"])
def test_a_bad_live_address_is_refused_with_what_was_expected(address: str) -> None:
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_address(address)
