"""The per-connection session: decode a frame, build the request context, dispatch it.

This is where the security edge will gate requests (SASL before anything else) and
where the authorization policy is applied; for now every connection is anonymous.
"""

from __future__ import annotations

import logging

from broker_core.context import Endpoint, RequestContext
from broker_core.dispatch import Dispatcher
from broker_core.naming import Namespace
from broker_core.protocol import ProtocolError
from listeners.server import ConnectionInfo, FrameError

log = logging.getLogger(__name__)
ANONYMOUS = "ANONYMOUS"


class Session:
    """One client connection's view of the broker."""

    def __init__(self, dispatcher: Dispatcher, info: ConnectionInfo, advertised: Endpoint,
                 home: Namespace) -> None:
        self.dispatcher = dispatcher
        self.info = info
        self.advertised = advertised
        self.home = home
        self.principal = ANONYMOUS

    async def handle(self, frame: memoryview) -> bytes | None:
        """Answer one request frame."""
        try:
            parsed = self.dispatcher.parse(frame)
        except ProtocolError as exc:
            raise FrameError(str(exc)) from exc
        ctx = RequestContext(
            listener=self.info.listener, advertised=self.advertised, principal=self.principal,
            home=self.home, client_id=parsed.header.client_id,
            api_version=parsed.header.api_version,
            client_host=self.info.peer.rsplit(":", 1)[0],
        )
        return await self.dispatcher.dispatch(ctx, parsed)

    def closed(self) -> None:
        """Nothing to release yet."""
        log.debug("connection from %s on %s closed", self.info.peer, self.info.listener)
