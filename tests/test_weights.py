"""Versioned weights through torchstore: both transports, across processes, dropped versions leave nothing."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest
import torch

from forge_nb import weights
from forge_nb.system.runtime import spawning
from forge_nb.weights import shm

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def store(runtime, tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(tmp_path / "shm"))
    await weights.initialize_store()
    yield
    await weights.shutdown_store()


def _state(scale: float) -> dict[str, torch.Tensor]:
    return {"model.embed_tokens.weight": torch.full((16, 8), scale, dtype=torch.bfloat16),
            "lm_head.weight": torch.arange(24.0).reshape(3, 8) * scale, "norm.weight": torch.ones(7) * scale}


@pytest.mark.parametrize("transport", ["shm", "torchstore"])
async def test_push_in_one_process_load_in_another(store, runtime, transport, tmp_path):
    from tests.actors_for_tests import WeightsReader

    await weights.push_state_dict(_state(2.0), 1, transport=transport)
    mesh = await spawning.spawn_mesh("reader", procs=2)
    reader = mesh.spawn("reader", WeightsReader)
    sums = await reader.checksums.call(1)
    expected = {k: float(v.float().sum()) for k, v in _state(2.0).items()}
    assert [v for _, v in sums.items()] == [expected, expected]
    got = await weights.load_state_dict(1)
    assert got["model.embed_tokens.weight"].dtype == torch.bfloat16 and got["norm.weight"].shape == (7,)
    assert await weights.stored_versions() == [1]
    files = list((tmp_path / "shm").glob("*")) if (tmp_path / "shm").exists() else []
    assert len(files) == (1 if transport == "shm" else 0)
    await weights.drop_version(1)
    assert await weights.stored_versions() == [] and not list((tmp_path / "shm").glob("*.bin"))


def _checksums(state: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v.float().sum()) for k, v in state.items()}


def _version_file(folder, version: int):
    (path,) = folder.glob(f"*-policy.v{version}.bin")
    return path


async def test_a_dropped_file_is_reused_unless_a_reader_still_holds_it(store, runtime, tmp_path):
    from tests.actors_for_tests import WeightsReader

    folder = tmp_path / "shm"
    await weights.push_state_dict(_state(1.0), 1, transport="shm")
    first = _version_file(folder, 1).stat().st_ino
    mesh = await spawning.spawn_mesh("reader")
    reader = mesh.spawn("reader", WeightsReader)
    await reader.hold.call_one(1)  # another process keeps views of version 1
    await weights.drop_version(1)
    assert len(list(folder.glob("*.spare"))) == 1
    await weights.push_state_dict(_state(2.0), 2, transport="shm")
    assert _version_file(folder, 2).stat().st_ino != first  # held: not rewritten under the reader
    assert await reader.held_checksums.call_one() == _checksums(_state(1.0))
    await reader.release.call_one()
    await weights.drop_version(2)
    await weights.push_state_dict(_state(3.0), 3, transport="shm")
    assert _version_file(folder, 3).stat().st_ino == first  # released: version 1's pages carry version 3
    assert await reader.checksums.call_one(3) == _checksums(_state(3.0))
    assert await weights.stored_versions() == [3] and len(list(folder.glob("*.spare"))) == 1


async def test_open_version_reads_every_version_through_one_kept_mapping(store, runtime, tmp_path):
    from tests.actors_for_tests import WeightsReader

    folder = tmp_path / "shm"
    mesh = await spawning.spawn_mesh("reader")
    reader = mesh.spawn("reader", WeightsReader)
    await weights.push_state_dict(_state(1.0), 1, transport="shm")
    inode = _version_file(folder, 1).stat().st_ino
    assert await reader.checksums_open.call_one(1) == (_checksums(_state(1.0)), 1)
    await weights.drop_version(1)
    await weights.push_state_dict(_state(2.0), 2, transport="shm")
    assert _version_file(folder, 2).stat().st_ino == inode
    # the reader's mapping of that file is reused, and it sees the new version's bytes
    assert await reader.checksums_open.call_one(2) == (_checksums(_state(2.0)), 1)

    with await weights.open_version(2) as state_dict:  # locked while in the block
        await weights.drop_version(2)
        await weights.push_state_dict(_state(3.0), 3, transport="shm")
        assert _version_file(folder, 3).stat().st_ino != inode
        assert _checksums(state_dict) == _checksums(_state(2.0))
    with pytest.raises(KeyError, match="version 2 is not in torchstore"):
        await weights.open_version(2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_gpu_to_gpu_through_page_locked_mappings(runtime, monkeypatch):
    from tests.actors_for_tests import WeightsReader

    folder = Path("/dev/shm") / f"forge_nb-test-{uuid.uuid4().hex[:8]}"  # tmpfs, as in a run: pinnable pages
    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(folder))
    await weights.initialize_store()
    try:
        mesh = await spawning.spawn_mesh("gpu-reader", env={"CUDA_VISIBLE_DEVICES": "0"})
        reader = mesh.spawn("reader", WeightsReader)
        for version in (1, 2):  # the second push reuses the first's file, and both sides' registrations
            state = {k: v.cuda() for k, v in _state(float(version)).items()}
            await weights.push_state_dict(state, version, transport="shm", dtype=torch.bfloat16)
            assert len(shm._pinned) == 1  # the writer's mapping
            expected = _checksums({k: v.to(torch.bfloat16) for k, v in _state(float(version)).items()})
            assert await reader.checksums_on_gpu.call_one(version) == (expected, 1)
            await weights.drop_version(version)
    finally:
        await weights.shutdown_store()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_gpu_weights_through_a_folder_on_disk_are_copied_unpinned_and_cuda_keeps_working(store, runtime):
    from tests.actors_for_tests import WeightsReader

    # the store fixture's folder is under tmp_path, on disk: CUDA refuses to page-lock such mappings
    mesh = await spawning.spawn_mesh("gpu-reader", env={"CUDA_VISIBLE_DEVICES": "0"})
    reader = mesh.spawn("reader", WeightsReader)
    await weights.push_state_dict({k: v.cuda() for k, v in _state(3.0).items()}, 1, transport="shm")
    assert shm._pinned == set()
    assert float((torch.ones(4, device="cuda") * 2).sum()) == 8.0  # no CUDA error left behind
    assert await reader.checksums_on_gpu.call_one(1) == (_checksums(_state(3.0)), 0)


@pytest.mark.parametrize("transport", ["shm", "torchstore"])
async def test_push_converts_floating_tensors_to_the_dtype_asked_for(store, transport):
    state = {"w": torch.linspace(-3, 3, 40).reshape(5, 8), "ids": torch.arange(6), "t": torch.ones(4, 4).t()}
    await weights.push_state_dict(state, 1, transport=transport, dtype=torch.bfloat16)
    got = await weights.load_state_dict(1)
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], state["w"].to(torch.bfloat16))
    assert got["ids"].dtype == torch.int64 and torch.equal(got["ids"], state["ids"])
    assert torch.equal(got["t"].float(), state["t"])  # a non-contiguous view is laid out whole


async def test_spares_are_bounded_and_shutdown_removes_every_file(runtime, tmp_path, monkeypatch):
    folder = tmp_path / "shm"
    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(folder))
    await weights.initialize_store()
    try:
        for version in range(1, 6):
            await weights.push_state_dict(_state(float(version)), version, transport="shm")
        for version in range(1, 5):
            await weights.drop_version(version)
        assert len(list(folder.glob("*.spare"))) == weights.SPARES
    finally:
        await weights.shutdown_store()
    assert list(folder.iterdir()) == []


async def test_reading_and_dropping_a_version_intern_none_of_its_file_names(store, monkeypatch):
    """The kernel drops a version every other step, and a generator reads one as often. Each version's file name
    is new, and an interned str takes a slot of the interpreter's table of interned strings that is not reused
    until the table is rebuilt, larger: pathlib interns every part of a path it parses, which once doubled a long
    run's kernel table (+1.9 MB)."""
    manifests = [await weights.push_state_dict(_state(float(v)), v, transport="shm") for v in (1, 2, 3)]
    interned: list[str] = []
    intern = sys.intern
    with monkeypatch.context() as patched:  # not undo(): the store fixture's FORGE_NB_SHM_DIR stays set
        patched.setattr(sys, "intern", lambda s: interned.append(s) or intern(s))
        for version in (1, 2, 3):  # a reader (a generator) maps each version's file
            with await weights.open_version(version) as state_dict:
                assert state_dict["norm.weight"][0].item() == version
        await weights.drop_version(1, manifest=manifests[0])  # the run's path: the manifest in hand
        await weights.drop_version(2, manifest=manifests[1])
        await weights.drop_version(3)  # the listing path
    assert await weights.stored_versions() == []
    assert not [s for s in interned if ".v" in s], f"version names interned: {interned}"


async def test_shm_views_are_private_copies_on_write(store):
    await weights.push_state_dict(_state(1.0), 3, transport="shm")
    first = await weights.load_state_dict(3)
    first["norm.weight"].add_(100.0)  # a consumer that writes changes its own copy only
    again = await weights.load_state_dict(3)
    assert torch.equal(again["norm.weight"], torch.ones(7))


async def test_a_handed_manifest_opens_its_version_without_asking_the_store(store, tmp_path):
    manifest = await weights.push_state_dict(_state(1.0), 4, transport="shm")
    assert manifest is not None and await weights.push_state_dict(_state(1.0), 9, transport="torchstore") is None
    store = weights.versions.store_client()
    await store.delete(f"{weights.weights_key(4)}/{weights.SHM_MANIFEST}")  # the store knows it no more
    with pytest.raises(KeyError):
        await weights.open_version(4)
    with await weights.open_version(4, manifest=manifest) as state_dict:  # the manifest alone finds the bytes
        assert _checksums(state_dict) == _checksums(_state(1.0))
    # one that names another version, namespace or host is no answer for this one
    assert weights.handed_version(5, "policy", manifest) is None
    assert weights.handed_version(4, "other", manifest) is None
    assert weights.handed_version(4, "policy", manifest | {"host": "elsewhere"}) is None
    assert weights.handed_version(4, "policy", None) is None
    Path(manifest["path"]).unlink()  # dropped since it was handed over
    with pytest.raises(FileNotFoundError), weights.handed_version(4, "policy", manifest):
        pass


async def test_an_unannounced_version_is_handed_then_announced(store, tmp_path):
    manifest = await weights.push_state_dict(_state(1.0), 3, transport="shm", announce=False)
    assert manifest is not None and await weights.stored_versions() == []  # in shared memory, not in the store
    with await weights.open_version(3, manifest=manifest) as state_dict:  # a reader handed it needs no store
        assert _checksums(state_dict) == _checksums(_state(1.0))
    await weights.announce_version(3, manifest)
    assert await weights.stored_versions() == [3]
    with await weights.open_version(3) as state_dict:  # and now one that asks the store finds it
        assert _checksums(state_dict) == _checksums(_state(1.0))
    # tensors that go through torchstore are put whatever announce says: readers on other hosts need them
    both = await weights.push_state_dict(_state(2.0), 4, transport="shm+torchstore", announce=False)
    assert both["torchstore"] and await weights.stored_versions() == [3, 4]
    assert await weights.drop_version(3, manifest=manifest) == 1 and await weights.drop_version(4, manifest=both) > 1
    assert await weights.stored_versions() == []


async def test_a_version_dropped_with_its_manifest_goes_whole(store, tmp_path):
    manifest = await weights.push_state_dict(_state(1.0), 6, transport="shm")
    both = await weights.push_state_dict(_state(2.0), 7, transport="shm+torchstore")  # tensors in the store too
    assert await weights.drop_version(6, manifest=manifest) == 1
    assert await weights.drop_version(7, manifest=both) > 1  # the listing path: every key of it
    assert await weights.stored_versions() == []
    assert not list((tmp_path / "shm").glob("*.bin")), "a dropped version left its file"


async def test_missing_version_names_what_exists(store):
    await weights.push_state_dict(_state(1.0), 5)
    with pytest.raises(KeyError, match=r"version 9 is not in torchstore \(stored: \[5\]\)"):
        await weights.load_state_dict(9)


def test_orphaned_shm_files_of_dead_writers_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(tmp_path))
    dead = [tmp_path / "999999999-policy.v3.bin", tmp_path / "999999999-policy-x.v2.spare"]
    mine = tmp_path / f"{os.getpid()}-policy.v4.bin"
    for path in [*dead, mine]:
        path.write_bytes(b"x")
    assert sorted(weights.remove_orphaned_shm()) == sorted(map(str, dead))
    assert mine.exists() and not any(path.exists() for path in dead)


# -- namespaces: runs side by side in one kernel ---------------------------------------------------------


@pytest.mark.parametrize("transport", ["shm", "torchstore"])
async def test_two_namespaces_keep_their_own_versions_and_bytes(store, runtime, tmp_path, transport):
    from tests.store_actors import NamespaceReader

    folder, other = tmp_path / "shm", "policy-runA"  # "policy-runA" starts like "policy": still apart
    for version in (1, 2, 3):
        await weights.push_state_dict(_state(float(version)), version, transport=transport)
        await weights.push_state_dict(_state(10.0 * version), version, transport=transport, namespace=other)
    assert await weights.stored_versions() == [1, 2, 3]
    assert await weights.stored_versions(namespace=other) == [1, 2, 3]
    if transport == "shm":
        names = sorted(p.name for p in folder.glob("*.bin"))
        assert len(names) == 6 and sum("-policy-runA.v" in n for n in names) == 3, names

    for version in (1, 2, 3):  # the first run drops everything it has
        assert await weights.drop_version(version) > 0
    assert await weights.stored_versions() == []
    assert await weights.stored_versions(namespace=other) == [1, 2, 3]
    assert await weights.drop_version(3) == 0  # nothing of "policy" left; the other's v3 untouched
    reader = (await spawning.spawn_mesh("reader")).spawn("reader", NamespaceReader)
    for version in (1, 2, 3):  # another process reads the other namespace's bytes, intact
        assert await reader.checksums.call_one(version, other) == _checksums(_state(10.0 * version))
    with pytest.raises(KeyError, match=r"policy version 2 is not in torchstore \(stored: none\)"):
        await weights.load_state_dict(2)
    if transport == "shm":
        assert sum("-policy-runA.v" in p.name for p in folder.glob("*.bin")) == 3
        assert not [p for p in folder.glob("*.bin") if "-policy.v" in p.name]


async def test_shutdown_drops_every_namespace_and_removes_its_files(runtime, tmp_path, monkeypatch):
    folder = tmp_path / "shm"
    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(folder))
    await weights.initialize_store()
    try:
        await weights.push_state_dict(_state(1.0), 1, transport="shm", namespace="policy-a")
        await weights.push_state_dict(_state(2.0), 1, transport="shm", namespace="policy-b")
        assert len(list(folder.glob("*.bin"))) == 2
    finally:
        await weights.shutdown_store()
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("bad", ["a.b", "run A", "", "x/y", 3])
async def test_a_namespace_that_is_not_one_key_component_is_refused(bad):
    with pytest.raises(ValueError, match=r"namespace=.*namespace_for\(name\)"):
        weights.weights_key(1, namespace=bad)
    with pytest.raises(ValueError, match="namespace="):  # before torchstore is asked anything
        await weights.push_state_dict(_state(1.0), 1, namespace=bad)
    with pytest.raises(ValueError, match="namespace="):
        await weights.stored_versions(namespace=bad)


def test_namespace_for_maps_any_run_name_to_a_distinct_valid_namespace():
    assert weights.namespace_for("runA") == "policy-runA"
    assert weights.weights_key(4, namespace="policy-runA") == "policy-runA.v4"
    names = ["run A", "run_A", "run.A", "run/A", "lr=1e-5", "ünï", "runA"]
    spaces = [weights.namespace_for(n) for n in names]
    assert len(set(spaces)) == len(names), spaces
    for space in spaces:
        assert weights.check_namespace(space) == space and space.startswith("policy-")
    assert weights.namespace_for("run A") == weights.namespace_for("run A")  # stable
    with pytest.raises(ValueError, match="non-empty name"):
        weights.namespace_for("")
