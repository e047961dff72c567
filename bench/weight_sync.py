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

    .venv/bin/python bench/weight_sync.py [--mb 512] [--loaders 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from forge_nb import runtime, weights  # noqa: E402


def memcpy_gbps(mb: int, repeats: int) -> float:
    from bench._weight_actors import make_state_dict

    src = make_state_dict(mb)
    dst = {k: torch.empty_like(v) for k, v in src.items()}
    nbytes = sum(t.numel() * t.element_size() for t in src.values())
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for k, v in src.items():
            dst[k].copy_(v)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times[1:]) / 1e9


async def main(mb: int, loaders: int, repeats: int) -> None:
    runtime.ensure_started()
    from bench._weight_actors import Loader, Pusher

    await weights.initialize_store()
    push_mesh = await runtime.spawn_mesh("bench-pusher")
    load_mesh = await runtime.spawn_mesh("bench-loaders", procs=loaders)
    pusher = push_mesh.spawn("pusher", Pusher, mb)
    threads = max(1, (os.cpu_count() or 1) // loaders)
    loader = load_mesh.spawn("loader", Loader, threads)
    nbytes = await pusher.nbytes.call_one()
    results: dict[str, list[tuple[float, float]]] = {"torchstore": [], "shm": []}
    version = 0
    for repeat in range(1 + repeats):  # the first round is a warm-up, as a run's first push is
        for transport in ("torchstore", "shm"):  # alternate, so noise hits both alike
            version += 1
            push_s = await pusher.push.call_one(version, transport)
            load_s = max(v for _, v in (await loader.load.call(version)).items())
            await weights.drop_version(version)  # as a run does once every generator has the next one
            if repeat:
                results[transport].append((push_s, load_s))
    memcpy = memcpy_gbps(mb, repeats)
    await push_mesh.stop()
    await load_mesh.stop()
    await weights.shutdown_store()

    print(f"state dict: {nbytes / 2**20:.0f} MiB bf16, {loaders} loaders ({threads} thread(s) each), "
          f"median of {repeats}")
    print(f"{'':12}{'push s':>9}{'load s':>9}{'GB/s':>9}{'vs memcpy':>11}")
    print(f"{'memcpy':12}{'':>9}{'':>9}{memcpy:9.2f}{1.0:11.3f}")
    gbps = {}
    for transport, pairs in results.items():
        push_s = statistics.median(p for p, _ in pairs)
        load_s = statistics.median(lo for _, lo in pairs)
        gbps[transport] = nbytes / (push_s + load_s) / 1e9
        print(f"{transport:12}{push_s:9.3f}{load_s:9.3f}{gbps[transport]:9.2f}{gbps[transport] / memcpy:11.3f}")
    print(f"shm vs raw torchstore: {gbps['shm'] / gbps['torchstore']:.1f}x")
    print(f"RESULT weight_sync_vs_memcpy {gbps['shm'] / memcpy:.3f} (target 0.30)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--loaders", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    asyncio.run(main(args.mb, args.loaders, args.repeats))
