"""Stage replicas on a Ray cluster: each runs in a Ray actor placed by its stage's `resources`.

omni keeps supervision: Ray only hosts the processes. `RayHost.spawn` starts a Ray actor (no Ray
restarts) on a node that fits the stage's resources, and that actor runs the same stage process as
on one machine (`python -m omni.cluster.proc`) as its child, told the node's IP (the bus binds a TCP
port there) and the node's id (edges to other nodes take the network channel). When the child
exits, or the actor dies with its node, the returned `RayProcess` says so and the supervisor
restarts the replica through `spawn` again, so it lands on a node that fits then.

A stage's `resources` (graph spec) name what its replica takes, in Ray's terms: "CPU", "GPU",
"memory" (bytes) and custom resources, all hard; "prefer:R" makes R a preference: while a live node
has R the replica takes a sliver of it (so it goes there), else it goes wherever the rest fits, so a
replica whose preferred node was lost comes back elsewhere. Without "GPU" a replica on a CUDA
device takes one GPU (Ray then sets its CUDA_VISIBLE_DEVICES, which `devices` index into); without
"CPU" it takes none (stage processes mostly wait on each other; say what yours need).

Ray is imported here only, and only when a RayHost is made (`pip install 'omni[ray]'`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from omni.kernel.errors import GraphError

log = logging.getLogger("omni.cluster")

STANDARD = ("CPU", "GPU", "memory")
PREFER = "prefer:"
PREFER_SHARE = 1e-3
CONNECT_TIMEOUT_S = 5.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--cluster ray needs Ray: pip install 'omni[ray]'") from None
    return ray


def parse_cluster(text: str) -> str:
    """`ray` (start a local cluster, or join $RAY_ADDRESS), `ray://HOST:PORT` (Ray Client) or
    `ray:HOST:PORT` (a cluster's GCS address) -> the address ray.init takes ("" for a local one)."""
    if text == "ray":
        return ""
    if text.startswith("ray://"):
        return text
    if text.startswith("ray:") and text[4:]:
        return text[4:]
    raise ValueError(f"--cluster takes ray, ray://HOST:PORT or ray:HOST:PORT, not {text!r}")


def _reachable(address: str) -> str:
    """This machine's IP on the route to `address`; a clear error when nothing answers there."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    host, port = parts.hostname, parts.port
    if not host or not port:
        raise ValueError(f"a Ray address needs HOST:PORT, not {address!r}")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
            return sock.getsockname()[0]
    except OSError as exc:
        raise ConnectionError(f"cannot reach the Ray cluster at {address}: {exc}") from None


def ray_options(spec: Any, live_nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The Ray actor options of one replica of stage `spec` (see the module docstring)."""
    resources = dict(spec.resources)
    for key, value in resources.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise GraphError(f"stage {spec.name!r}: resources[{key!r}] must be a number >= 0, got {value!r}")
    prefer = {k[len(PREFER):]: v for k, v in resources.items() if k.startswith(PREFER)}
    cuda = spec.device.startswith("cuda") or any(d.startswith("cuda") for d in spec.devices)
    options: dict[str, Any] = {
        "num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 1 if cuda else 0),
        "resources": {k: v for k, v in resources.items() if k not in STANDARD and not k.startswith(PREFER)},
        "max_restarts": 0, "max_concurrency": 4}  # omni restarts; run() and signal() at once
    if "memory" in resources:
        options["memory"] = resources["memory"]
    fits = [n for n in live_nodes if all(n["Resources"].get(k, 0) >= v for k, v in prefer.items())]
    if prefer and fits:  # a sliver of each, so any number of replicas fit where they are preferred
        options["resources"].update({k: PREFER_SHARE for k in prefer})
    elif prefer:
        log.warning("stage %s: no live node has %s; placed by its other resources", spec.name, sorted(prefer))
    return options


class _StageHost:
    """The Ray actor around one stage process (its parent, on the node Ray chose)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(self, config: dict[str, Any]) -> int:
        """Start the stage process and wait for it; its exit code (negative: the signal that ended it)."""
        import ray

        from omni.gpu_env import keep_multicast_off

        where = {"OMNI_BUS_HOST": ray.util.get_node_ip_address(), "OMNI_NODE": ray.get_runtime_context().get_node_id()}
        config = {**config, "parent_pid": os.getpid(), "env": {**config["env"], **where}}
        self.proc = subprocess.Popen([sys.executable, "-m", "omni.cluster.proc"], stdin=subprocess.PIPE,
                                     close_fds=True, env=keep_multicast_off(dict(os.environ)))
        self.proc.stdin.write(json.dumps(config).encode())
        self.proc.stdin.close()
        code = self.proc.wait()
        self._tidy(config)
        return code

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    @staticmethod
    def _tidy(config: dict[str, Any]) -> None:
        """What a stage process that died left in this node's /dev/shm (its own host can't see it)."""
        from omni.transport.channels import release_leftovers
        from omni.kernel.graph import Graph
        from omni.kernel.rundir import shm_owner

        graph = Graph.from_dict(config["graph"])
        release_leftovers(graph, shm_owner(config["instance"], config["stage"], config["replica"]))


class RayProcess:
    """A stage process in a Ray actor, as the supervisor sees any host's process."""

    def __init__(self, ray: Any, actor: Any, config: dict[str, Any]) -> None:
        self.pid = 0  # on another host; the replica's ActorReady says which
        self._ray, self._actor = ray, actor
        self._code: int | None = None
        self._why = ""
        actor.run.remote(config).future().add_done_callback(self._ended)

    def _ended(self, future: Any) -> None:
        """In Ray's own thread: only note it (calling Ray from here would deadlock)."""
        try:
            self._code = future.result()
        except Exception as exc:  # the actor died (its node was lost, or it was killed)
            self._code, self._why = -signal.SIGKILL, f"its Ray actor is gone ({type(exc).__name__})"

    def poll(self) -> int | None:
        if self._code is not None and self._actor is not None:
            self._release()
        return self._code

    def _release(self) -> None:
        """Give the actor's resources back to the cluster (it outlives its child otherwise)."""
        actor, self._actor = self._actor, None
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception:
            pass

    def reason(self) -> str:
        if self._why:
            return self._why
        code = self._code
        return f"killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"

    def kill(self) -> None:
        """As a crash would: SIGKILL the stage process; the actor goes with it (or at once, if it never started)."""
        if self._code is None and self._actor is not None:
            self._actor.signal.remote(int(signal.SIGKILL))

    async def stop(self, timeout_s: float) -> None:
        """Wait for it to leave (it was told to), then SIGTERM, then kill the actor."""
        deadline = time.monotonic() + timeout_s
        while self._code is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self._code is None and self._actor is not None:
            self._actor.signal.remote(int(signal.SIGTERM))
            await asyncio.sleep(0.5)
        if self._actor is not None:
            self._release()


class RayHost:
    """Join a Ray cluster (or start a local one) and place stage replicas on its nodes."""

    def __init__(self, address: str = "", namespace: str = "omni") -> None:
        ray = self.ray = import_ray()
        if address:
            self.bus_host = _reachable(address)
        if not ray.is_initialized():
            ray.init(address=address or None, namespace=namespace, log_to_driver=False)
        if not address:
            self.bus_host = ray.util.get_node_ip_address()
        self._remote = ray.remote(_StageHost)

    def spawn(self, config: dict[str, Any], spec: Any) -> RayProcess:
        live = [n for n in self.ray.nodes() if n.get("Alive")]
        actor = self._remote.options(**ray_options(spec, live)).remote()
        return RayProcess(self.ray, actor, config)
