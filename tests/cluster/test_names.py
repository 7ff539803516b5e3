"""What needs no engine (the fast tier): where an image is kept in the cluster's registry and
the reference a node pulls; the local cluster's names (two clusters never share a namespace,
a socket folder or a cgroup parent) and its state file, readable by root only, read back as
written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bridge.cluster.images import Registry
from bridge.sandbox.distribution import split_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from local_cluster.layout import ClusterLayout  # noqa: E402
from local_cluster.state import Proc, State  # noqa: E402
from local_cluster.teardown import is_cgroup_parent  # noqa: E402


def test_an_image_is_kept_under_the_registrys_prefix_and_pulled_at_the_nodes_address():
    registry = Registry("127.0.0.1:41234", "10.250.77.1:5000")
    assert registry.repository("worker-bridge/base:0.1.0") == (
        "127.0.0.1:41234/worker-bridge-cluster/worker-bridge/base"
    )
    assert registry.repository("worker-bridge/base:0.1.0", for_node=True) == (
        "10.250.77.1:5000/worker-bridge-cluster/worker-bridge/base"
    )
    # An image's own registry host is not part of the path; a plain name is.
    assert registry.repository("ghcr.io/a/b:1").endswith("/worker-bridge-cluster/a/b")
    assert registry.repository("busybox").endswith("/worker-bridge-cluster/busybox")
    assert Registry("r:5000").repository("x:1", for_node=True) == "r:5000/worker-bridge-cluster/x"


def test_a_reference_splits_into_repository_and_tag_even_with_a_registry_port():
    assert split_reference("host:5000/a/b:tag") == ("host:5000/a/b", "tag")
    assert split_reference("host:5000/a/b") == ("host:5000/a/b", "latest")
    assert split_reference("busybox") == ("busybox", "latest")


def test_two_clusters_share_no_namespace_folder_or_cgroup_parent():
    one, two = ClusterLayout("wbc"), ClusterLayout("wbc-n1")
    names = [set(c.netns_names(3)) for c in (one, two)]
    assert not names[0] & names[1]
    assert one.node(1).cgroup_parent != two.node(1).cgroup_parent
    assert one.scratch != two.scratch and one.node(2).home.parent == one.scratch
    # `down` of one never takes the other's cgroup folders or namespaces.
    assert is_cgroup_parent(one, one.node(1).cgroup_parent)
    assert is_cgroup_parent(one, one.node(1).cgroup_parent, "n1")
    assert not is_cgroup_parent(one, one.node(2).cgroup_parent, "n1")
    assert not is_cgroup_parent(one, two.node(1).cgroup_parent)  # wbc-wbc-n1-n1
    assert not is_cgroup_parent(one, f"{one.node(1).cgroup_parent}x")
    assert one.netns_names(2)[-1] == "wbc-hub"  # the hub last: the others' links end in it
    for bad in ("", "Upper", "1abc", "a" * 16, "a/b"):
        with pytest.raises(ValueError):
            ClusterLayout(bad)


def test_the_state_file_is_root_only_and_reads_back_as_written(tmp_path):
    layout = ClusterLayout("wbs", tmp_path)
    state = State.new(layout)
    state.processes.append(Proc("dockerd", 123, 456, "/x.log", node="n1", netns="wbs-n1"))
    state.save(layout.state_file)
    assert layout.state_file.stat().st_mode & 0o777 == 0o600
    assert State.load(layout.state_file) == state
    assert State.load(tmp_path / "none.json") is None
