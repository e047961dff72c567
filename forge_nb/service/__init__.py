"""Services of actor replicas, in TorchForge's vocabulary.

``Cls.options(procs=, with_gpus=, num_replicas=).as_service()`` spawns replicas, each on its own
process mesh; ``svc.ep.route()`` sends to one healthy replica, ``svc.ep.fanout()`` to all,
``async with svc.session():`` sticks to one. ``.as_actor()`` spawns one replica:
``actor.ep.call_one()`` (or ``.route()``, as the documents write it). Dead replicas are detected, their
requests retried and they are respawned; what reaches a caller when that is not enough is an
``ActorFailure``.
"""

from monarch.actor import endpoint

from forge_nb.service.actor import ForgeActor, Options
from forge_nb.service.errors import ActorFailure, ActorStartFailed, NoHealthyReplica, ReplicaDied
from forge_nb.service.replica import Replica, ReplicaStatus
from forge_nb.service.service import ActorHandle, Affinity, Service, ServiceEvent

__all__ = [
    "ActorFailure", "ActorHandle", "ActorStartFailed", "Affinity", "ForgeActor", "NoHealthyReplica", "Options",
    "Replica", "ReplicaDied", "ReplicaStatus", "Service", "ServiceEvent", "endpoint",
]
