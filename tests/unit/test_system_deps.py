"""scripts/system-deps.sh installs the Debian test dependencies and leaves the machine's
services as it found them: it never stops or disables a service it did not start or enable.

The real script runs against a fake machine: `dpkg`, `apt-get`, `systemctl` and `id` on PATH
are stubs that keep the packages installed and the units enabled and active as files in a
state directory, and log every call. The fake `apt-get install` does what a Debian package's
maintainer scripts do: it enables the package's units (deb-systemd-helper), then starts them
unless the policy-rc.d forbids it (deb-systemd-invoke, exit 101).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "system-deps.sh"
CLIENTS = ("curl", "openjdk-17-jdk-headless", "wrk")
PACKAGES = ("nginx", "prometheus", "prometheus-alertmanager", "gcc", "victoria-metrics", *CLIENTS)
# The units each package's install enables and starts (prometheus recommends the exporter).
UNITS = {
    "nginx": ["nginx"],
    "prometheus": ["prometheus", "prometheus-node-exporter"],
    "prometheus-alertmanager": ["prometheus-alertmanager"],
    "gcc": [],
    "victoria-metrics": ["victoria-metrics"],
    "curl": [],
    "openjdk-17-jdk-headless": [],
    "wrk": [],
}

DPKG = """#!/bin/sh
echo "dpkg $*" >> "$FAKE/calls"
[ "$1" = -s ] && [ -e "$FAKE/installed/$2" ]
"""
ID = """#!/bin/sh
[ "$1" = -u ] && echo 0
"""
APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$FAKE/calls"
case " $* " in *" install "*) ;; *) exit 0 ;; esac
[ -x "$POLICY_RC_D" ] && echo "policy present" >> "$FAKE/calls"
for arg in "$@"; do
  case "$arg" in -*|install|DPkg::*) continue ;; esac
  touch "$FAKE/installed/$arg"
  for unit in $(cat "$FAKE/units/$arg" 2>/dev/null); do
    touch "$FAKE/enabled/$unit"                       # deb-systemd-helper enable
    if [ -x "$POLICY_RC_D" ] && { "$POLICY_RC_D" "$unit" start; [ $? -eq 101 ]; }; then
      echo "start $unit forbidden" >> "$FAKE/calls"  # deb-systemd-invoke start
    else
      touch "$FAKE/active/$unit"
      echo "start $unit by the install" >> "$FAKE/calls"
    fi
  done
done
"""
SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$FAKE/calls"
now=0; cmd=; unit=
for arg in "$@"; do
  case "$arg" in
    --now) now=1 ;;
    --*) ;;
    *) if [ -z "$cmd" ]; then cmd=$arg; else unit=$arg; fi ;;
  esac
done
case "$cmd" in
  is-enabled) [ -e "$FAKE/enabled/$unit" ] ;;
  is-active) [ -e "$FAKE/active/$unit" ] ;;
  start) touch "$FAKE/active/$unit" ;;
  stop) rm -f "$FAKE/active/$unit" ;;
  enable) touch "$FAKE/enabled/$unit"; [ $now -eq 0 ] || touch "$FAKE/active/$unit" ;;
  disable) rm -f "$FAKE/enabled/$unit"; [ $now -eq 0 ] || rm -f "$FAKE/active/$unit" ;;
  *) exit 1 ;;
esac
"""


@dataclass
class Machine:
    root: Path
    env: dict[str, str]

    @property
    def policy(self) -> Path:
        return self.root / "policy-rc.d"

    def state(self, kind: str) -> set[str]:
        return {p.name for p in (self.root / kind).iterdir()}

    def set(self, kind: str, *names: str) -> None:
        for name in names:
            (self.root / kind / name).touch()

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def run(self) -> list[str]:
        """Runs the real script; returns the calls it made."""
        before = {"enabled": self.state("enabled"), "active": self.state("active")}
        done = subprocess.run(
            ["bash", str(SCRIPT)], env=self.env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        calls = self.calls()
        assert_undoes_only_its_own(calls, before)
        return calls


def assert_undoes_only_its_own(calls: list[str], before: dict[str, set[str]]) -> None:
    """No stop of a unit that was active before the run, no disable of one that was enabled
    before, and no `disable --now` (it stops whatever runs)."""
    for call in calls:
        words = call.split()
        if words[0] != "systemctl":
            continue
        assert "--now" not in words, call
        if "stop" in words:
            assert words[-1] not in before["active"], f"stopped a service it did not start: {call}"
        if "disable" in words:
            assert words[-1] not in before["enabled"], (
                f"disabled a service it did not enable: {call}"
            )


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"dpkg": DPKG, "id": ID, "apt-get": APT_GET, "systemctl": SYSTEMCTL}.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    for kind in ("installed", "enabled", "active", "units"):
        (tmp_path / kind).mkdir()
    for pkg, units in UNITS.items():
        (tmp_path / "units" / pkg).write_text(" ".join(units))
    (tmp_path / "run-systemd").mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE": str(tmp_path),
        "POLICY_RC_D": str(tmp_path / "policy-rc.d"),
        "SYSTEMD_RUNTIME_DIR": str(tmp_path / "run-systemd"),
    }
    return Machine(tmp_path, env)


def installs(calls: list[str]) -> list[list[str]]:
    """The packages of each `apt-get install` call."""
    out = []
    for call in calls:
        words = call.split()
        if words[0] == "apt-get" and "install" in words:
            out.append([w for w in words[words.index("install") + 1 :] if not w.startswith("-")])
    return out


def test_all_present_touches_nothing(machine):
    machine.set("installed", *PACKAGES)
    machine.set("enabled", "nginx", "prometheus")
    machine.set("active", "nginx", "prometheus")
    calls = machine.run()
    assert [c.split()[0] for c in calls] == ["dpkg"] * len(PACKAGES), calls
    assert machine.state("active") == {"nginx", "prometheus"}
    assert machine.state("enabled") == {"nginx", "prometheus"}


def test_only_gcc_missing_leaves_the_running_nginx_alone(machine):
    machine.set(
        "installed", "nginx", "prometheus", "prometheus-alertmanager", "victoria-metrics", *CLIENTS
    )
    machine.set("enabled", "nginx", "prometheus-alertmanager")
    machine.set("active", "nginx", "prometheus-alertmanager")
    calls = machine.run()
    assert installs(calls) == [["gcc"]]
    assert not [c for c in calls if " stop " in f"{c} " or " disable " in f"{c} "], calls
    assert machine.state("active") == {"nginx", "prometheus-alertmanager"}
    assert machine.state("enabled") == {"nginx", "prometheus-alertmanager"}
    assert not machine.policy.exists(), "the policy-rc.d it wrote is removed afterwards"


def test_nginx_missing_is_installed_without_starting_it(machine):
    machine.set(
        "installed", "prometheus", "prometheus-alertmanager", "gcc", "victoria-metrics", *CLIENTS
    )
    machine.set("enabled", "prometheus")
    machine.set("active", "prometheus")
    calls = machine.run()
    assert installs(calls) == [["nginx"]]
    assert "policy present" in calls and "start nginx forbidden" in calls, calls
    assert not [c for c in calls if "stop" in c.split()], "nothing was started, nothing stopped"
    assert "nginx" not in machine.state("active")
    assert "nginx" not in machine.state("enabled"), "the unit its install enabled is disabled"
    assert machine.state("active") == machine.state("enabled") == {"prometheus"}, "untouched"
    assert not machine.policy.exists(), "the policy-rc.d it wrote is removed afterwards"


def test_a_running_nginx_unit_of_another_origin_survives_the_install(machine):
    """nginx built from source with its own nginx.service: the Debian package is missing, the
    unit runs; installing the package must leave that unit running and enabled."""
    machine.set(
        "installed", "prometheus", "prometheus-alertmanager", "gcc", "victoria-metrics", *CLIENTS
    )
    machine.set("enabled", "nginx")
    machine.set("active", "nginx")
    calls = machine.run()
    assert installs(calls) == [["nginx"]]
    assert machine.state("active") == machine.state("enabled") == {"nginx"}
    assert not [c for c in calls if {"stop", "disable"} & set(c.split())], calls


def test_what_the_install_started_under_a_permissive_policy_is_stopped(machine):
    """The machine's own policy-rc.d allows starts: it is kept as it is; the daemons the
    install started (the machine had none of them) are stopped and disabled again."""
    machine.policy.write_text("#!/bin/sh\nexit 0\n")
    machine.policy.chmod(0o755)
    machine.set("installed", "gcc")
    calls = machine.run()
    assert installs(calls) == [
        ["nginx", "prometheus", "prometheus-alertmanager", "victoria-metrics", *CLIENTS]
    ]
    assert "start nginx by the install" in calls, calls
    assert machine.state("active") == set() and machine.state("enabled") == set()
    assert machine.policy.read_text() == "#!/bin/sh\nexit 0\n", "the machine's policy is kept"


def test_without_systemd_no_unit_is_asked_about(machine):
    machine.env["SYSTEMD_RUNTIME_DIR"] = str(machine.root / "absent")
    machine.set(
        "installed", "nginx", "prometheus", "prometheus-alertmanager", "victoria-metrics", *CLIENTS
    )
    calls = machine.run()
    assert installs(calls) == [["gcc"]]
    assert not [c for c in calls if c.startswith("systemctl")], calls
