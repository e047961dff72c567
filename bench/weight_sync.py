"""Weight sync: a state dict pushed by one process and loaded by N others, against raw torchstore and memcpy.

In one run, on the same bytes (transformer-shaped bf16 tensors):
* memcpy: one host copy of the whole state dict into preallocated tensors, in this process;
* torchstore: ``forge_nb.weights`` with ``transport="torchstore"`` (torchstore's own state-dict path,
  tensors as monarch messages), push then N concurrent loads;
* shm: ``forge_nb.weights`` with its same-host shared-memory transport (the default), push then N loads.
A load includes copying into the loader's own tensors, as a generator's reload does. GB/s is
bytes / (push + slowest load), the median of ``--repeats`` rounds after one warm-up round (in a
run, every push after the first reuses a dropped version's shared-memory file).
Ends with ``RESULT weight_sync_vs_memcpy <shm GB/s / memcpy GB/s>``.

With ``--device cuda`` the pusher's tensors and the loaders' parameters live on the GPU (all on GPU 0
when there is one: a trainer and its generators sharing a card), and the same run also measures:
* shm, pageable: the shm transport with page-locking off (``FORGE_NB_PIN_SHM=0``), beside the default
  that registers its mappings with CUDA;
* staged copy: in this process, GPU -> pinned host buffer -> GPU, the floor of any design that stages
  the weights in host memory (as the shm transport does);
* GPU copy: one device-to-device copy, the floor of a transport that never leaves the GPU (CUDA IPC).
It ends with ``RESULT weight_sync_gpu_vs_staged <shm GB/s / staged-copy GB/s>`` instead.

With ``--hosts N`` (N >= 2) it measures weight sync across the hosts of a monarch job instead: a
``ProcessJob({"writer": 1, "readers": N - 1})`` (one worker process per simulated host, all on this
machine) is taken into use (``forge_nb.system.hosts.cluster.use_job``), the pusher runs on ``writer[0]`` and pushes
with ``transport="shm+stream"`` (the default while a job spans several hosts), and in the same run, on
the same bytes, rounds alternate between:
* same host: ``--loaders`` loaders on the writer's host (``hosts="writer"``), which map the pusher's file;
* cross host: ``--loaders`` loaders spread over the reader hosts (``hosts="readers"``, each reader host
  gets some; ``--loaders`` must be at least N - 1), whose loads go through the per-host copy: the first
  loader on a host pulls the version through the writer's TCP stream into that host's shared memory,
  the others there map it (``forge_nb.weights.stream``).
Push s, slowest load s and GB/s (bytes / (push + slowest load)) for each, median of ``--repeats`` after
a warm-up round, and reader CPU s (a loader process's CPU time over its load, every thread, the loaders'
mean: on another host the pull's receiving is most of it), beside the limit of the machine's loopback TCP
measured in the same run (before the job starts): the same number of bytes sent by a plain socket from
one process to another, received into a buffer already mapped (median of ``--repeats`` after a warm-up).
It ends with
``RESULT weight_sync_cross_host_vs_same_host <cross GB/s / same GB/s>``, the two GB/s figures
(``RESULT weight_sync_same_host_gbps``, ``RESULT weight_sync_cross_host_gbps``) and
``RESULT weight_sync_loopback_tcp_gbps``. The meshes are stopped, the store shut down and the job released
even when the run fails. CPU only.

    .venv/bin/python bench/weight_sync.py [--mb 512] [--loaders 2] [--repeats 3] [--device cuda]
    .venv/bin/python bench/weight_sync.py --hosts 3 [--mb 512] [--loaders 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from forge_nb import weights  # noqa: E402
from forge_nb.system.runtime import lifecycle, registry, spawning


def _copy_gbps(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], repeats: int, device: str) -> float:
    """GB/s of copying every tensor of ``src`` into ``dst`` (median of ``repeats`` after one warm-up);
    ``device``: the GPU the copy involves, or "cpu"."""
    from bench._weight_actors import sync_device

    nbytes = sum(t.numel() * t.element_size() for t in src.values())
    times = []
    for _ in range(repeats + 1):
        sync_device(device)
        start = time.perf_counter()
        for k, v in src.items():
            dst[k].copy_(v)
        sync_device(device)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times[1:]) / 1e9


def medians(results: dict[str, list[tuple[float, float]]], nbytes: int) -> dict[str, tuple[float, float, float]]:
    """Each case's median push s, median (slowest) load s, and GB/s = bytes / (push + load)."""
    out = {}
    for name, rounds in results.items():
        push_s, load_s = statistics.median(p for p, _ in rounds), statistics.median(lo for _, lo in rounds)
        out[name] = (push_s, load_s, nbytes / (push_s + load_s) / 1e9)
    return out


def baselines(mb: int, repeats: int, device: str) -> dict[str, float]:
    """GB/s of the plain copies a transport is measured against, in this process."""
    from bench._weight_actors import make_state_dict

    host = make_state_dict(mb)
    out = {"memcpy": _copy_gbps(host, {k: torch.empty_like(v) for k, v in host.items()}, repeats, "cpu")}
    if device != "cpu":
        gpu = {k: v.to(device) for k, v in host.items()}
        pinned = {k: torch.empty_like(v).pin_memory() for k, v in host.items()}
        down, up = _copy_gbps(gpu, pinned, repeats, device), _copy_gbps(pinned, gpu, repeats, device)
        out["staged copy"] = 1 / (1 / down + 1 / up)  # GPU -> pinned host -> GPU, one after the other
        out["GPU copy"] = _copy_gbps(gpu, {k: torch.empty_like(v) for k, v in gpu.items()}, repeats, device)
    return out


async def main(mb: int, loaders: int, repeats: int, device: str) -> None:
    lifecycle.ensure_started()
    from bench._weight_actors import Loader, Pusher

    await weights.initialize_store()
    threads = max(1, (os.cpu_count() or 1) // loaders)
    # transport name -> (how forge_nb.weights is asked to push, the pusher/loader pair that does it)
    pairs: dict[str, tuple[str, Any, Any]] = {}
    meshes = []
    setups = {"": "1"} if device == "cpu" else {"": "1", ", pageable": "0"}
    for suffix, pin in setups.items():
        env = {"FORGE_NB_PIN_SHM": pin}
        if device != "cpu":
            env["CUDA_VISIBLE_DEVICES"] = "0"  # every process on one card, as a trainer and its generators
        push_mesh = await spawning.spawn_mesh("bench-pusher", env=env)
        load_mesh = await spawning.spawn_mesh("bench-loaders", procs=loaders, env=env)
        meshes += [push_mesh, load_mesh]
        pusher = push_mesh.spawn("pusher", Pusher, mb, device)
        loader = load_mesh.spawn("loader", Loader, threads, device)
        if not suffix:
            pairs["torchstore"] = ("torchstore", pusher, loader)
        pairs["shm" + suffix] = ("shm", pusher, loader)
    nbytes = await pairs["shm"][1].nbytes.call_one()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in pairs}
    version = 0
    for repeat in range(1 + repeats):  # the first round is a warm-up, as a run's first push is
        for name, (transport, pusher, loader) in pairs.items():  # alternate, so noise hits all alike
            version += 1
            push_s = await pusher.push.call_one(version, transport)
            load_s = max(seconds for _, (seconds, _cpu) in (await loader.load.call(version)).items())
            await weights.drop_version(version)  # as a run does once every generator has the next one
            if repeat:
                results[name].append((push_s, load_s))
    for mesh in meshes:
        await mesh.stop()
    await weights.shutdown_store()
    base = baselines(mb, repeats, device)

    print(f"state dict: {nbytes / 2**20:.0f} MiB bf16 on {device}, {loaders} loaders "
          f"({threads} thread(s) each), median of {repeats}")
    print(f"{'':18}{'push s':>9}{'load s':>9}{'GB/s':>9}{'vs memcpy':>11}")
    for name, gbps in base.items():
        print(f"{name:18}{'':>9}{'':>9}{gbps:9.2f}{gbps / base['memcpy']:11.3f}")
    gbps = {}
    for name, (push_s, load_s, gbps[name]) in medians(results, nbytes).items():
        print(f"{name:18}{push_s:9.3f}{load_s:9.3f}{gbps[name]:9.2f}{gbps[name] / base['memcpy']:11.3f}")
    print(f"shm vs raw torchstore: {gbps['shm'] / gbps['torchstore']:.1f}x")
    if device == "cpu":
        print(f"RESULT weight_sync_vs_memcpy {gbps['shm'] / base['memcpy']:.3f} (target 0.30)")
    else:
        print(f"shm page-locked vs pageable: {gbps['shm'] / gbps['shm, pageable']:.2f}x; "
              f"vs one GPU copy: {gbps['shm'] / base['GPU copy']:.4f}")
        print(f"RESULT weight_sync_gpu_vs_staged {gbps['shm'] / base['staged copy']:.3f}")


def spread(loaders: int, hosts: int) -> list[int]:
    """How many of ``loaders`` go to each of ``hosts`` hosts: as even as can be, the first ones get the rest."""
    return [loaders // hosts + (i < loaders % hosts) for i in range(hosts)]


async def main_hosts(hosts: int, mb: int, loaders: int, repeats: int) -> None:
    """Same-host against cross-host weight sync on a ProcessJob of ``hosts`` simulated hosts (see above)."""
    lifecycle.ensure_started()
    from monarch.job import ProcessJob

    from bench._weight_actors import Loader, Pusher, state_dict_bytes
    from forge_nb.system.hosts import cluster

    transport = "shm+stream"
    threads = max(1, (os.cpu_count() or 1) // loaders)
    loopback = loopback_tcp_gbps(state_dict_bytes(mb), repeats)  # on a quiet machine, before the job starts
    job = ProcessJob({"writer": 1, "readers": hosts - 1})

    async def end_job() -> None:
        if cluster.current() is not None:
            await cluster.release_job()  # the job's hosts (ProcessJob's workers) end
        else:
            await asyncio.to_thread(job.kill)  # use_job failed midway: what it brought up ends

    # every clean-up step runs, last registered first, even when the run or an earlier step fails:
    # the meshes stop, then the store, the reader hosts' copies (named after loaders now gone) go, the job ends
    async with contextlib.AsyncExitStack() as cleanup:
        cleanup.push_async_callback(end_job)
        await cluster.use_job(job)
        cleanup.callback(weights.remove_orphaned_shm)
        cleanup.push_async_callback(weights.shutdown_store)
        await weights.initialize_store()  # on the kernel's host, as in a run

        async def spawn(name: str, procs: int, group: str) -> registry.Mesh:
            mesh = await spawning.spawn_mesh(name, procs=procs, hosts=group)
            cleanup.push_async_callback(mesh.stop)
            return mesh

        push_mesh = await spawn("bench-pusher", 1, "writer")
        pusher = push_mesh.spawn("pusher", Pusher, mb, "cpu")
        same_mesh = await spawn("bench-loaders-same", loaders, "writer")
        cross = [await spawn("bench-loaders-cross", procs, "readers") for procs in spread(loaders, hosts - 1)]
        # case -> the loader actor meshes whose loads it waits for (the slowest counts)
        cases: dict[str, list[Any]] = {"same host": [same_mesh.spawn("loader", Loader, threads, "cpu")],
                                       "cross host": [mesh.spawn("loader", Loader, threads, "cpu") for mesh in cross]}
        where = {mesh.name: mesh.host for mesh in (push_mesh, same_mesh, *cross)}
        readers = sorted(h.name for h in cluster.current().hosts if h.group == "readers")
        if push_mesh.host != same_mesh.host or sorted(m.host for m in cross) != readers:
            raise RuntimeError(f"the meshes were not placed as this bench needs: {where}")
        nbytes = await pusher.nbytes.call_one()
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        reader_cpu: dict[str, list[float]] = {name: [] for name in cases}  # per round, the loaders' mean
        version = 0
        for repeat in range(1 + repeats):  # the first round is a warm-up, as a run's first push is
            for name, loader_meshes in cases.items():  # alternate, so noise hits both alike
                version += 1
                push_s = await pusher.push.call_one(version, transport)
                loads = [v for answers in await asyncio.gather(*(loader.load.call(version) for loader in loader_meshes))
                         for _, v in answers.items()]
                load_s = max(seconds for seconds, _ in loads)
                await weights.drop_version(version)  # as a run does once every generator has the next one
                if repeat:
                    results[name].append((push_s, load_s))
                    reader_cpu[name].append(statistics.mean(cpu for _, cpu in loads))

    print(f"state dict: {nbytes / 2**20:.0f} MiB bf16 on cpu, transport {transport}, ProcessJob with "
          f"{hosts} hosts, {loaders} loaders per case ({threads} thread(s) each), median of {repeats}")
    print("placed: " + ", ".join(f"{name} on {host}" for name, host in where.items()))
    print(f"{'':18}{'push s':>9}{'load s':>9}{'GB/s':>9}{'vs loopback':>13}{'reader CPU s':>14}")
    print(f"{'loopback TCP':18}{'':>9}{'':>9}{loopback:9.2f}{1:13.3f}")
    gbps = {}
    for name, (push_s, load_s, gbps[name]) in medians(results, nbytes).items():
        print(f"{name:18}{push_s:9.3f}{load_s:9.3f}{gbps[name]:9.2f}{gbps[name] / loopback:13.3f}"
              f"{statistics.median(reader_cpu[name]):14.3f}")
    print(f"RESULT weight_sync_cross_host_vs_same_host {gbps['cross host'] / gbps['same host']:.3f} (target 0.5)")
    print(f"RESULT weight_sync_same_host_gbps {gbps['same host']:.2f}")
    print(f"RESULT weight_sync_cross_host_gbps {gbps['cross host']:.2f} (target 1.0)")
    print(f"RESULT weight_sync_loopback_tcp_gbps {loopback:.2f}")


_SENDER = """
import socket, sys
nbytes, rounds = int(sys.argv[1]), int(sys.argv[2])
data = bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256)
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
for _ in range(rounds):
    conn, _ = server.accept()
    with conn:
        conn.sendall(data)
"""


def loopback_tcp_gbps(nbytes: int, repeats: int) -> float:
    """GB/s of a plain TCP copy of ``nbytes`` over loopback, from another process into a buffer of this one
    already in memory (median of ``repeats`` after one warm-up): what one stream can move on this machine."""
    import socket
    import subprocess

    sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(nbytes), str(repeats + 1)],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(sender.stdout.readline())
        view, times = memoryview(bytearray(nbytes)), []  # the warm-up round faults its pages in
        for _ in range(repeats + 1):
            start, got = time.perf_counter(), 0
            with socket.create_connection(("127.0.0.1", port)) as conn:
                while got < nbytes:
                    n = conn.recv_into(view[got:], min(nbytes - got, 16 * 2**20))
                    if n == 0:
                        raise ConnectionError(f"the loopback sender stopped after {got} of {nbytes} bytes")
                    got += n
            times.append(time.perf_counter() - start)
        return nbytes / statistics.median(times[1:]) / 1e9
    except BaseException:
        sender.kill()  # it would wait for the rounds it was promised
        raise
    finally:
        sender.wait(timeout=30)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--loaders", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--hosts", type=int, default=None,
                    help="N >= 2: same-host against cross-host sync on a ProcessJob of N simulated hosts")
    args = ap.parse_args()
    if args.hosts is None:
        asyncio.run(main(args.mb, args.loaders, args.repeats, "cuda:0" if args.device == "cuda" else "cpu"))
    else:
        if args.hosts < 2:
            ap.error(f"--hosts {args.hosts}: a job across hosts needs N >= 2 (one writer host, N - 1 reader hosts)")
        if args.loaders < args.hosts - 1:
            ap.error(f"--loaders {args.loaders}: every one of the {args.hosts - 1} reader hosts needs a loader")
        if args.device != "cpu":
            ap.error("--hosts measures the CPU path only (no --device cuda)")
        asyncio.run(main_hosts(args.hosts, args.mb, args.loaders, args.repeats))
