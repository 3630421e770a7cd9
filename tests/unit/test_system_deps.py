"""scripts/system-deps.sh installs the Debian test dependencies without starting their
daemons (issue 25): run it with fake dpkg/apt-get/sudo on PATH that record what the real
ones would see."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "system-deps.sh"


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def test_packages_are_installed_with_service_starts_forbidden(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    policy = tmp_path / "policy-rc.d"
    record = tmp_path / "record"
    _fake(bin_dir, "dpkg", "exit 1")  # every package missing
    _fake(bin_dir, "sudo", 'exec "$@"')
    _fake(bin_dir, "systemctl", "exit 0")
    # What invoke-rc.d would do during the install: run the policy and see whether it forbids.
    _fake(
        bin_dir,
        "apt-get",
        f'case "$*" in *install*) "{policy}" nginx start; echo "policy=$?" >> "{record}";; esac',
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "POLICY_RC_D": str(policy)}
    done = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert record.read_text().strip() == "policy=101", "services may start during the install"
    assert not policy.exists(), "the policy is removed afterwards"
