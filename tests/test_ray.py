"""`encode --ray` on a real multi-node Ray cluster on this machine: a head plus worker nodes, each its own raylet
with its own resources, all on 127.0.0.1. The driver is a real `lsr-index` process; nodes, actors and the driver
are killed with SIGKILL mid-run, and every output is compared with the single-machine output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import kept_line, run_cli
from procs import children, stat

from lsr_index.vectors.shards import read_shard

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "corpus.jsonl"
# loopback only: Ray would otherwise bind to this host's outward address; no usage reports
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
SETTINGS = ["--shard-docs", "5", "--doc-max-length", "64"]  # 60 documents → 12 shards, quick on CPU
NODE = {"num_cpus": 1, "object_store_memory": 100 << 20, "node_ip_address": "127.0.0.1"}


def lsr(*args: str) -> list[str]:
    return [sys.executable, "-m", "lsr_index", "--quiet", "encode", *args]


def _corpus(directory: Path, docs: int) -> Path:
    path = directory / "corpus.jsonl"
    path.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:docs]))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("corpus"), 60)


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory) -> tuple[Path, Path]:
    """160 documents in 32 shards, and their single-machine output (the same command in this process): enough
    shards that a node whose encoder starts later still gets some, and a run that outlasts the manifest's
    one-second save interval by several saves, so that a driver killed after the first listed shard still has
    work left."""
    corpus = _corpus(tmp_path_factory.mktemp("long"), 160)
    reference = tmp_path_factory.mktemp("long-ref") / "v"
    done = run_cli("--quiet", "encode", str(corpus), "-o", str(reference), "--device", "cpu", *SETTINGS)
    assert done.returncode == 0, done.stderr
    return corpus, reference


@pytest.fixture(scope="module")
def cluster():
    """A head without CPUs (so that nothing encodes beside the driver) and two worker nodes of one CPU each."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    head = {**NODE, "num_cpus": 0, "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(2):
            cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def _shards(out: Path) -> int:
    try:
        return len(json.loads((out / "manifest.json").read_text())["shards"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def _same_output(out: Path, reference: Path) -> dict:
    """Same shard list and checksums, same vectors; nothing else under shards/ (no attempt left, no temporary)."""
    ours, theirs = (json.loads((d / "manifest.json").read_text()) for d in (out, reference))
    assert ours["complete"] and ours["shards"] == theirs["shards"]
    for shard in ours["shards"]:
        assert list(read_shard(out / shard["file"])) == list(read_shard(reference / shard["file"]))
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(Path(s["file"]).name for s in ours["shards"])
    return ours["stats"]


def _encoders(node) -> list[int]:
    """Pids of the encoder actors of a Cluster node: its raylet's children named after the actor class."""
    return children(node.all_processes["raylet"][0].process.pid, b"EncoderActor")


def _wait_encoding(nodes, proc: subprocess.Popen, timeout: float = 240):
    """(node, pid) of the first encoder seen inside encode() (Ray titles the process after the running method)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for node in nodes:
            for pid in _encoders(node):
                try:
                    if b"encode" in (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"EncoderActor", b""):
                        return node, pid
                except OSError:
                    continue
        time.sleep(0.02)
    raise AssertionError("no encoder was seen encoding")


def _run(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_without_ray_one_line_says_what_to_install(corpus, tmp_path):
    shadow = tmp_path / "noray" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(lsr(str(corpus), "-o", str(tmp_path / "v"), "--ray"), capture_output=True, text=True,
                          env=env)
    assert done.returncode == 1
    assert done.stderr == ("error: --ray needs Ray, which is not installed: pip install -e '.[ray]' in the lsr-index "
                           "checkout (or bash pipelines/setup.sh --dev)\n")
    assert not (tmp_path / "v").exists()


def test_an_input_path_taken_for_the_address_is_refused(corpus, tmp_path):
    pytest.importorskip("ray")
    done = run_cli("--quiet", "encode", str(corpus), "--ray", str(corpus), "-o", str(tmp_path / "v"))
    assert done.returncode == 1 and "not a Ray address" in done.stderr and "--ray=ADDRESS" in done.stderr
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.slow
def test_a_killed_encoder_process_loses_nothing(cluster, long_corpus, tmp_path):
    corpus, reference = long_corpus
    out = tmp_path / "v"
    proc = _run(lsr(str(corpus), "-o", str(out), *SETTINGS, "--ray", cluster.address, "--ray-cpus", "1"))
    try:
        os.kill(_wait_encoding(list(cluster.worker_nodes), proc)[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=480)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "lost the encoder on cpu" in err and "holding shard" in err, err
    _same_output(out, reference)


@pytest.fixture(scope="module")
def killed_driver(cluster, long_corpus, tmp_path_factory) -> dict[str, Path]:
    """The output of a driver SIGKILLed after its first listed shard, and a copy of it: one killed run for both
    reruns. The copy waits until Ray has ended the dead job's encoders, which could still be writing."""
    corpus, _ = long_corpus
    out = tmp_path_factory.mktemp("killed") / "v"
    proc = _run(lsr(str(corpus), "-o", str(out), *SETTINGS, "--ray", cluster.address, "--ray-cpus", "1"))
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and _shards(out) < 1:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    deadline = time.time() + 60
    while time.time() < deadline and any(_encoders(node) for node in cluster.worker_nodes):
        time.sleep(0.1)
    copy = out.with_name("copy")
    shutil.copytree(out, copy, symlinks=True)
    return {"cluster": out, "one machine": copy}


@pytest.mark.slow
@pytest.mark.parametrize("rerun_on", ["cluster", "one machine"])
def test_a_killed_driver_resumes(cluster, long_corpus, killed_driver, rerun_on):
    """The rerun, on the cluster or on one machine, encodes only what is missing and removes the killed run's
    attempt directories."""
    corpus, reference = long_corpus
    out = killed_driver[rerun_on]
    published = _shards(out)
    assert 1 <= published < 32, published
    assert list((out / "shards").glob(".attempt-*")), "the killed driver left no attempt to clean up"
    if rerun_on == "one machine":
        again = run_cli("--quiet", "encode", str(corpus), "-o", str(out), *SETTINGS, "--device", "cpu")
    else:
        again = subprocess.run(lsr(str(corpus), "-o", str(out), *SETTINGS, "--ray", cluster.address, "--ray-cpus",
                                   "1"), capture_output=True, text=True, timeout=480)
    assert again.returncode == 0, again.stderr
    stats = _same_output(out, reference)
    assert stats["resumed_at"] >= 5 and stats["docs_this_run"] == 160 - stats["resumed_at"]


def test_an_address_where_nothing_listens_is_one_line(corpus, tmp_path):
    """A cluster address where nothing listens: one line at once. ray.init would retry it for minutes (20 tries of
    ~35 s), printing Ray's connection warnings; the timeout only bounds a hang."""
    pytest.importorskip("ray")
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(lsr(str(corpus), "-o", str(tmp_path / "v"), "--ray", f"127.0.0.1:{port}"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == f"error: --ray 127.0.0.1:{port}: cannot connect to the Ray cluster at 127.0.0.1:{port}: " \
                          "Connection refused; is the cluster running (`ray status`)?\n"
    assert not (tmp_path / "v").exists()


def _group(pgid: int) -> list[int]:
    """Pids of the live processes of a process group."""
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and (fields := stat(int(e.name))) and fields[0] not in "ZX" and int(fields[2]) == pgid]


@pytest.mark.slow
def test_sigterm_while_a_new_local_cluster_starts_leaves_nothing(corpus, tmp_path):
    """SIGTERM while ray.init starts the local cluster (its raylet is up, its agents starting): exit 143 with the
    resume line, and none of the cluster's processes left. Left to Ray's handler, it would exit 15 without a word, and
    the node's agents would still run a minute after the driver had ended."""
    pytest.importorskip("ray")
    proc = subprocess.Popen(lsr(str(corpus), "-o", str(tmp_path / "v"), *SETTINGS, "--ray", "local", "--ray-cpus",
                                "1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not children(proc.pid, b"raylet"):
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before its cluster started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        deadline = time.time() + 30  # the cluster's processes keep the driver's process group
        while time.time() < deadline and _group(proc.pid):
            time.sleep(0.1)
        left = _group(proc.pid)
    finally:
        proc.kill()
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert (proc.returncode, err) == (143, f"terminated: {kept_line(tmp_path / 'v')}\n")
    assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in left]


@pytest.mark.slow
def test_sigterm_on_a_cluster_saves_ends_its_encoders_and_resumes(cluster, long_corpus, tmp_path):
    """SIGTERM of a driver connected to a running cluster, mid-encode: exit 143 with the resume line (ray.init's own
    SIGTERM handler would exit 15, under a stack dump of Ray's C++ core), the cluster's nodes live on, this job's
    encoders end, and the rerun resumes to one machine's output."""
    corpus, reference = long_corpus
    out = tmp_path / "v"
    proc = _run(lsr(str(corpus), "-o", str(out), *SETTINGS, "--ray", cluster.address, "--ray-cpus", "1"))
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and _shards(out) < 1:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (143, f"terminated: {kept_line(out)}\n")
    assert all(node.all_processes["raylet"][0].process.poll() is None
               for node in [cluster.head_node, *cluster.worker_nodes])
    deadline = time.time() + 60
    while time.time() < deadline and any(_encoders(node) for node in cluster.worker_nodes):
        time.sleep(0.1)
    assert not any(_encoders(node) for node in cluster.worker_nodes), "this job's encoders outlived it"
    again = subprocess.run(lsr(str(corpus), "-o", str(out), *SETTINGS, "--ray", cluster.address, "--ray-cpus", "1"),
                           capture_output=True, text=True, timeout=480)
    assert again.returncode == 0, again.stderr
    assert _same_output(out, reference)["resumed_at"] >= 5


@pytest.mark.slow
def test_an_encoder_whose_node_left_before_it_was_placed_is_lost_not_fatal(cluster, long_corpus, tmp_path):
    """A node still listed alive when the run plans its encoders (Ray learns of a death only after missed health checks)
    but gone when its encoder is placed: that encoder is lost, the others encode everything, both of them (the cluster's
    output equals one machine's), where a run started right after a node's removal would otherwise end in a traceback
    (ActorUnschedulableError). A node id that no node has stands for the departed node; the driver runs in this process
    (the killed-driver test's cluster rerun is the CLI's `--ray` run start to end)."""
    from lsr_index.encode.cluster import RayCluster
    from lsr_index.encode.job import EncodeJob, EncodeOptions
    from lsr_index.encode.run import encode
    from lsr_index.settings import CPU_PIECE_DOCS

    corpus, reference = long_corpus
    ray_cluster = RayCluster(cluster.address, 1)
    gone = "de" * 28  # (all ff is Ray's nil id)
    ray_cluster.plan.append((gone, "cpu", 1, {"num_cpus": 1}))
    ray_cluster.names[gone] = "node 127.0.0.1 (departed, dededede)"
    job = EncodeJob(inputs=(str(corpus),), options=EncodeOptions(shard_docs=5, doc_max_length=64, progress=False,
                                                                 piece_docs=CPU_PIECE_DOCS))  # as the CLI's on CPU
    encode(job, tmp_path / "v", ray_cluster)
    stats = _same_output(tmp_path / "v", reference)
    docs = {node["node"]: node["docs"] for node in stats["per_node"]}
    assert docs.pop("node 127.0.0.1 (departed, dededede)") == 0 and len(docs) == 2 and sum(docs.values()) == 160
    assert all(docs.values()), f"both live nodes encode: {docs}"


@pytest.mark.slow
def test_a_killed_node_loses_nothing(cluster, long_corpus, tmp_path):
    """SIGKILL the raylet of a node whose encoder is inside a shard: the shard runs on the other node. The cluster
    keeps one worker node after it: only the remote-failure test, which brings its own node, follows."""
    corpus, reference = long_corpus
    out = tmp_path / "v"
    proc = _run(lsr(str(corpus), "-o", str(out), *SETTINGS, "--ray", cluster.address, "--ray-cpus", "1"))
    doomed = None
    try:
        doomed, _ = _wait_encoding(list(cluster.worker_nodes), proc)
        os.kill(doomed.all_processes["raylet"][0].process.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=480)
    finally:
        proc.kill()
        if doomed is not None:
            cluster.remove_node(doomed, allow_graceful=False)
    assert proc.returncode == 0, err
    assert "holding shard" in err, err
    stats = _same_output(out, reference)
    assert len(stats["per_node"]) == 2


@pytest.mark.slow
def test_a_remote_failure_is_one_line_naming_the_node(cluster, corpus, tmp_path):
    """A node whose Python cannot load the model (its PyTorch raises on import): the run stops, saying where."""
    broken_torch = tmp_path / "site" / "torch"
    broken_torch.mkdir(parents=True)
    (broken_torch / "__init__.py").write_text("raise ImportError('PyTorch is broken on this node')\n")
    broken = cluster.add_node(**NODE, env_vars={"PYTHONPATH": str(tmp_path / "site")})
    cluster.wait_for_nodes()
    try:
        done = subprocess.run(lsr(str(corpus), "-o", str(tmp_path / "v"), *SETTINGS, "--ray", cluster.address,
                                  "--ray-cpus", "1"), capture_output=True, text=True, timeout=480)
    finally:
        cluster.remove_node(broken, allow_graceful=False)
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: node 127.0.0.1 (") and "cannot start an encoder on cpu" in done.stderr
    assert "PyTorch is broken on this node" in done.stderr, done.stderr
    assert not list((tmp_path / "v" / "shards").glob(".attempt-*"))
