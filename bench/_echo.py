"""Echo actors for the service-overhead benchmark: the same endpoint, raw monarch and ForgeActor."""

from monarch.actor import Actor, endpoint

from forge_nb.service import ForgeActor


class RawEcho(Actor):
    @endpoint
    async def echo(self, payload: bytes) -> bytes:
        return payload


class Echo(ForgeActor):
    @endpoint
    async def echo(self, payload: bytes) -> bytes:
        return payload
