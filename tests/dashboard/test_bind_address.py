"""The dashboard listens on loopback only by default (beyond it, writes need a login): the Streamlit config
beside app.py and the Makefile's command both say 127.0.0.1, and a real `streamlit run` (no address
flag), from the repository root or from any other directory, binds nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from serve_fixture import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_config_binds_loopback() -> None:
    for path in (ROOT / "dashboard" / ".streamlit" / "config.toml", ROOT / ".streamlit" / "config.toml"):
        config = tomllib.loads(path.read_text())
        assert config["server"]["address"] == "127.0.0.1"


def _run_recipe(*overrides: str) -> list[str]:
    out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "run", *overrides], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if "streamlit run" in line]


def test_make_run_binds_loopback_unless_asked() -> None:
    (line,) = _run_recipe()
    assert "--server.address 127.0.0.1" in line
    (line,) = _run_recipe("ADDRESS=0.0.0.0")
    assert "--server.address 0.0.0.0" in line


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* write them) listening on `port`."""
    found = set()
    for name in ("tcp", "tcp6"):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            addr, p = local.rsplit(":", 1)
            if int(p, 16) == port and state == "0A":  # LISTEN
                found.add(addr)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net")
@pytest.mark.parametrize("where", ["repo", "elsewhere"])
def test_streamlit_run_listens_on_loopback_only_from_any_directory(tmp_path: Path, where: str) -> None:
    """From the repository root and from another directory (issue 25, item 16: the config was read
    relative to the working directory only; it now sits beside app.py, which Streamlit also reads)."""
    import time

    port = free_port()
    env = {**os.environ, "ORCHARD_DB": str(tmp_path / "none.db")}
    env.pop("STREAMLIT_SERVER_ADDRESS", None)
    cwd = ROOT if where == "repo" else tmp_path
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py"),
                             "--server.port", str(port)],
                            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not _listening(port) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.3)
        time.sleep(1.0)  # IPv4 and IPv6 sockets come up one after the other
        assert _listening(port) == {"0100007F"}  # 127.0.0.1 only: no 0.0.0.0, no [::]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
