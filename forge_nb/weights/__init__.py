"""Versioned policy weights through TorchStore: a trainer pushes version v, generators load it.

Layout: version ``v`` of a namespace lives under keys starting ``<namespace>.v{v}/``, with Hugging Face
parameter names (what vLLM loads); a torchtitan trainer converts before pushing. The namespace is
``"policy"`` unless a caller names another: each run in a kernel has its own (:func:`namespace_for`),
so runs side by side never see, or drop, each other's versions. torchstore's key index is a trie
split on ".", so a namespace is one component (letters, digits, ``_`` and ``-``) and listing one
namespace's versions never reaches another's.

The transports behind the same calls (``push_state_dict``, ``load_state_dict``/``open_version``,
``drop_version``):

* ``"torchstore"``: torchstore's state-dict path; every tensor travels as monarch messages (~0.25 GB/s
  on these machines, no RDMA NIC). Works across hosts.
* ``"shm"`` (the default on one host): one file per version under ``/dev/shm``, and only a small
  manifest (``<key>/__shm__``) in torchstore; see ``forge_nb.weights.shm``. ``bench/weight_sync.py``
  measures both.
* ``"shm+stream"`` (the default in a process placed on a job's host when the job has several,
  ``forge_nb.system.hosts.cluster``): shm, and the writer's process serves the file over TCP. Readers on the writer's
  host map its file; on any other host the first reader of a version pulls it through one stream into
  that host's shared memory, where the host's other readers map it (a host keeps only the newest version
  it copied); a reader that cannot reach the stream has the writer put the tensors in torchstore and
  fetches them from there. See ``forge_nb.weights.stream``. Which host a process is on:
  ``shm.host_id()``.
* ``"shm+torchstore"``: the same, with the tensors put in torchstore by every push (readers that cannot
  reach the stream find them there at once; a push costs as much as a torchstore one).

The store's life. The kernel's torchstore (a controller and one storage volume, both in the kernel's process)
is started either directly, ``await initialize_store()`` (tests, benches, a notebook's own cells) and stopped by
``await shutdown_store()``; or *leased*: ``await lease_store(holder)`` starts it for its first holder,
``await release_store(holder)`` stops it after the last one lets go (see ``forge_nb.system.leases``). Runs
and services whose actor class ``needs_store`` lease it, so a second run's shutdown never tears the
store down under the first. The last release stops the store only if a lease started it: a store
started directly stays until ``shutdown_store()``, which stops it whoever holds leases (the next
lease starts it again). While leased, the store holds a runtime lease (``forge_nb.system.runtime.lifecycle.lease``).

Every function works in any process (kernel or actor): torchstore is reached through
``forge_nb.weights.torchstore``, which carries the monarch-0.7 compatibility binding.
"""

from forge_nb.weights.shm import SPARES, LoadedVersion, remove_orphaned_shm, shm_root, stored_dtype
from forge_nb.weights.store import (
    STORE,
    initialize_store,
    lease_store,
    release_store,
    shutdown_store,
    store_holders,
    store_running,
)
from forge_nb.weights.versions import (
    PREFIX,
    SHM_MANIFEST,
    TRANSPORTS,
    announce_version,
    check_namespace,
    drop_version,
    for_other_hosts,
    handed_version,
    load_state_dict,
    namespace_for,
    open_version,
    push_state_dict,
    stored_versions,
    weights_key,
)

__all__ = [
    "PREFIX", "SHM_MANIFEST", "SPARES", "STORE", "TRANSPORTS", "LoadedVersion", "announce_version", "check_namespace",
    "drop_version", "for_other_hosts", "handed_version", "initialize_store", "lease_store", "load_state_dict",
    "namespace_for", "open_version", "push_state_dict", "release_store", "remove_orphaned_shm", "shm_root",
    "shutdown_store", "store_holders", "store_running", "stored_dtype", "stored_versions", "weights_key",
]
