"""The pod tests need nothing of the host but ports taken free at run time, and leave no pod
behind, also when a test or the play itself fails.

The whole session runs with the host's port 8000 taken (tests/pod/conftest.py's
``host_port_8000_taken``), so every other pod test passing is the proof that none of them
needs it; the first test here checks that it is indeed taken.
"""

from __future__ import annotations

import errno
import socket
import uuid
from pathlib import Path

import pytest
import yaml

from tests.pod.conftest import MODEL_SERVER_PORT, kube_played, pods_named, publish_ports

pytestmark = pytest.mark.pod


def simulator_deployment(name: str, image: str) -> dict:
    """A one-container Deployment: the simulator on the model server's port."""
    labels = {"app": name}
    container = {
        "name": "model-server",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["simulate", "--listen", f"127.0.0.1:{MODEL_SERVER_PORT}"],
        "ports": [{"name": "http", "containerPort": MODEL_SERVER_PORT}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def write(tmp: Path, deployment: dict) -> Path:
    path = tmp / f"{deployment['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(deployment, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"])
def test_the_hosts_port_8000_is_taken_while_the_pods_play(host):
    with socket.socket() as sock, pytest.raises(OSError) as refused:
        sock.bind((host, MODEL_SERVER_PORT))  # as podman's port publishing binds it
    assert refused.value.errno == errno.EADDRINUSE


def test_a_pod_is_removed_when_the_test_using_it_fails(image, tmp_path):
    name = f"llm-sidecar-fail-test-{uuid.uuid4().hex[:6]}"
    deployment = simulator_deployment(name, image)
    (host,) = publish_ports(deployment).values()
    assert host != MODEL_SERVER_PORT
    with pytest.raises(RuntimeError, match="the test failed"):
        with kube_played(write(tmp_path, deployment), name) as pod:
            assert pods_named(name) == [pod]
            raise RuntimeError("the test failed")
    assert pods_named(name) == []


def test_a_pod_that_cannot_start_is_removed(image, tmp_path):
    """The host port is taken (port 8000, as a pod with the fixed port had it): the play
    fails, and the pod podman leaves in Created is removed."""
    name = f"llm-sidecar-fail-test-{uuid.uuid4().hex[:6]}"
    deployment = simulator_deployment(name, image)
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] = (
        MODEL_SERVER_PORT
    )
    entered = False
    with pytest.raises(AssertionError, match="kube play"):
        with kube_played(write(tmp_path, deployment), name):
            entered = True
    assert not entered, "the play succeeded on a taken host port"
    assert pods_named(name) == []
