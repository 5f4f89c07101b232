"""The README's walk as a newcomer meets it: its marked shell blocks, as written, in order, in
one bash, at the root of a working copy, against a fresh `make run`."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.daemons import free_port

ROOT = Path(__file__).resolve().parent.parent
CONTROLPLANE = Path(sys.executable).parent / "better-compute-controlplane"
MARK = "<!-- readme-test -->"
# A marked block: the comment, then a fenced sh or bash block right below it.
BLOCK = re.compile(re.escape(MARK) + r"\n```(?:sh|bash)\n(.*?)\n```\n", re.S)
MAKE_RUN = "127.0.0.1:8080"  # where the README says `make run` serves


def readme_walk() -> str:
    """The marked blocks of README.md, in order, as one script."""
    text = (ROOT / "README.md").read_text()
    blocks = BLOCK.findall(text)
    assert blocks and len(blocks) == text.count(MARK), "each mark must sit right above a block"
    return "\n".join(blocks)


def wait_for(path: Path, text: str, demo: subprocess.Popen[bytes], seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = path.read_text()
        if text in found:
            return found
        assert demo.poll() is None, found
        time.sleep(0.1)
    raise AssertionError(path.read_text())


def test_the_readme_walk_runs_as_written(tmp_path: Path) -> None:
    """`make run`, then every marked command of the README in order: a host joins and is
    ready with its two sick GPUs unsold, a reservation is placed and ended on it, a drain
    completes, the agent the walk started is stopped, a policy change is planned and applied
    at the plan's version; the demo's terminal shows no info log
    lines, and its commands are in var/try-this.txt."""
    # A working copy as the walk needs it: the venv `make run` made, the recorded hosts.
    (tmp_path / ".venv").symlink_to(sys.prefix)
    (tmp_path / "agent" / "fixtures").mkdir(parents=True)
    fixtures = ROOT / "agent" / "fixtures" / "host-fixtures.json"
    (tmp_path / "agent" / "fixtures" / "host-fixtures.json").symlink_to(fixtures)
    (tmp_path / "tmp").mkdir()
    port = free_port()
    script = readme_walk()
    assert MAKE_RUN in script
    (tmp_path / "walk.sh").write_text(
        "set -euo pipefail\n" + script.replace(MAKE_RUN, f"127.0.0.1:{port}")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "config"), TMPDIR=str(tmp_path / "tmp"))
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        # As `make run` starts it, with the reconciler's passes close together (the drain).
        demo = subprocess.Popen(
            [
                str(CONTROLPLANE),
                "demo",
                "--data",
                "var",
                "--listen",
                f"127.0.0.1:{port}",
                "--reconcile-interval",
                "0.5",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    walk: subprocess.Popen[str] | None = None
    try:
        terminal = wait_for(log, "Ctrl-C stops everything", demo)
        assert (tmp_path / "var" / "try-this.txt").read_text() in terminal
        walk = subprocess.Popen(
            ["bash", "walk.sh"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: what it leaves running is found
        )
        output, _ = walk.communicate(timeout=60)
        assert walk.returncode == 0, output
        assert re.search(r"^tenant:\s+acme$", output, re.M), output
        assert '"code":"INVALID_INPUT"' in output and '"code":"CONFLICT"' in output, output
        assert re.search(r"dgx-h100-sick\s+ready\s+8x H100 \(2 unhealthy\)", output), output
        assert re.search(r"^gpu\s+8\s+6\s+0\s+6\s", output, re.M), output  # 6 of 8 sold
        # The first get races the agent's delivery: it shows the reservation placed or already
        # active; the get after the wait shows it active, and it is ended after that.
        states = re.findall(r"^state:\s+(pending|placed|active|ended)$", output, re.M)
        assert states[:3] in (["placed", "active", "ended"], ["active", "active", "ended"]), output
        assert "drain:           drained: kernel update" in output, output
        assert "reboot needed: yes" in output, output  # the local render
        # C3: an offer for a term, its end shown to the owner and to the tenant
        assert re.search(r"^offered to globex: gpu 32 \(priority 10, until 20\S+\)$", output, re.M)
        assert re.search(r"^offer ends: 20\S+Z$", output, re.M), output
        # C1, C2: the plan of a hostReserve bump, then applied at the version it was made at
        assert "apply with: --version 2" in output, output
        assert re.search(r"^vcpu\s+\d+\s+\d+ \(less\)$", output, re.M), output
        assert "uncovered: globex gpu max 32 over 6 schedulable after" in output, output
        assert re.search(r"^version:\s+3$", output, re.M), output
        # `kill "$AGENT"` stopped the host's agent: nothing of the walk is left running.
        for _ in range(100):
            try:
                os.killpg(walk.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the walk left a process running")
        # The terminal has the banner and no routine log line; the logs are in var/.
        terminal = log.read_text()
        assert "[info" not in terminal, terminal
        assert (
            "path=/api/compute/nodes/report" in (tmp_path / "var" / "controlplane.log").read_text()
        )
        assert "joined" in (tmp_path / "var" / "agents" / "demo-h100" / "agent.log").read_text()
    finally:
        if walk is not None:  # the walk and what it started, if a failure left them running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(walk.pid, signal.SIGKILL)
            walk.wait()
        demo.send_signal(signal.SIGINT)  # Ctrl-C
        demo.wait(timeout=30)
