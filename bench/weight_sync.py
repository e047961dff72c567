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

    .venv/bin/python bench/weight_sync.py [--mb 512] [--loaders 2] [--repeats 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from forge_nb import runtime, weights  # noqa: E402


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
    runtime.ensure_started()
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
        push_mesh = await runtime.spawn_mesh("bench-pusher", env=env)
        load_mesh = await runtime.spawn_mesh("bench-loaders", procs=loaders, env=env)
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
            load_s = max(v for _, v in (await loader.load.call(version)).items())
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
    for name, rounds in results.items():
        push_s = statistics.median(p for p, _ in rounds)
        load_s = statistics.median(lo for _, lo in rounds)
        gbps[name] = nbytes / (push_s + load_s) / 1e9
        print(f"{name:18}{push_s:9.3f}{load_s:9.3f}{gbps[name]:9.2f}{gbps[name] / base['memcpy']:11.3f}")
    print(f"shm vs raw torchstore: {gbps['shm'] / gbps['torchstore']:.1f}x")
    if device == "cpu":
        print(f"RESULT weight_sync_vs_memcpy {gbps['shm'] / base['memcpy']:.3f} (target 0.30)")
    else:
        print(f"shm page-locked vs pageable: {gbps['shm'] / gbps['shm, pageable']:.2f}x; "
              f"vs one GPU copy: {gbps['shm'] / base['GPU copy']:.4f}")
        print(f"RESULT weight_sync_gpu_vs_staged {gbps['shm'] / base['staged copy']:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--loaders", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()
    asyncio.run(main(args.mb, args.loaders, args.repeats, "cuda:0" if args.device == "cuda" else "cpu"))
