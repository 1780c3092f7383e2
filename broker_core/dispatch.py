"""From a request frame to a response frame: the API table, decoding and encoding.

A handler runs as its request's dispatch stage, and returns its response or
:class:`~broker_core.stages.Later` (its waiting stage); :mod:`broker_core.stages` says
what belongs to which stage and why one connection's requests stay in order.

Every API served is listed once, with the versions implemented; ApiVersions advertises
exactly that table. A frame that cannot be decoded, an unknown API key or an unsupported
version (other than of ApiVersions, which gets the v0 answer Kafka gives), or a null in a
field its schema does not let be null, is a
:class:`~broker_core.codec.errors.ProtocolError`: the caller closes the connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar, cast, overload

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker_core import metrics
from broker_core.codec import schema_guards
from broker_core.codec.errors import ProtocolError
from broker_core.codec.framing import (
    Prewritten,
    RequestHeader,
    frame_parts,
    frame_response,
    parse_header,
    peek_header,
    response_header,
)
from broker_core.codec.produce_reader import ForbiddenNull, ProduceBody
from broker_core.context import RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode
from broker_core.null_fields import first_forbidden_null
from broker_core.stages import Later
from common.frames import Frame

schema_guards.install()  # before any request is decoded

if TYPE_CHECKING:  # the quotas' modules import the APIs, which import this one
    from broker_core.quotas.manager import Throttle
    from broker_core.quotas.throttling import Throttling

log = logging.getLogger(__name__)

_Req = TypeVar("_Req", bound="ApiMessage")  # a string: the class has no truth value
Body = ApiMessage | ProduceBody
"""A decoded request: a schema message, or one read by a :class:`BodyReader`."""
_Body = TypeVar("_Body", bound=Body)
_Read = TypeVar("_Read", bound=Body, covariant=True)
Response = ApiMessage | Prewritten
"""What a handler answers with: a schema message, or one that writes its own body."""
Answered = Response | Later[Response | None] | None
"""A dispatch stage's result: the response, None (no response is due) or :class:`Later`
(the waiting stage giving either)."""
Handler = Callable[[Engine, RequestContext, _Body], Awaitable[Answered]]
"""A request's dispatch stage."""
ResponseBound = Callable[[Engine, _Body], int]
Answer = Frame | None | Coroutine[object, None, Frame | None]
"""A framed response, None, or the coroutine of a waiting stage giving either."""
Mute = Callable[[int], None]
"""Told to stop reading a connection for so many milliseconds (a throttled request)."""
API_VERSIONS_KEY = 18
SMALL_RESPONSE_BOUND = 16 * 1024
"""The response bound of an API without its own: small enough that a full queue of such
requests (``maxQueuedRequests``, 500) fits in the default ``maxPendingResponseBytes``
(8 MiB), so pipelined produces, commits or metadata requests never wait for one another.
Their finished responses count at their real size."""


def _taking_any(request: type[_Body], handler: Handler[_Body]) -> Handler[Body]:
    """``handler`` as one of the table's: it takes any decoded message and checks it is
    ``request``'s (no extra coroutine: the handler's own is returned)."""
    def run(engine: Engine, ctx: RequestContext, body: Body) -> Awaitable[Answered]:
        assert isinstance(body, request)
        return handler(engine, ctx, body)
    return run


def _bound_taking_any(request: type[_Body],
                      bound: ResponseBound[_Body]) -> ResponseBound[Body]:
    """``bound`` as one of the table's, as :func:`_taking_any`."""
    def run(engine: Engine, body: Body) -> int:
        assert isinstance(body, request)
        return bound(engine, body)
    return run


class BodyReader(Generic[_Read]):
    """Reads an API's request bodies itself instead of the schema library (a hot path a
    profile proved hot): ``read(body, version)`` gives a ``body_type``; it raises on
    garbage, and :class:`~broker_core.codec.produce_reader.ForbiddenNull` for a null the
    schema forbids."""

    __slots__ = ("body_type", "read")

    def __init__(self, body_type: type[_Read],
                 read: Callable[[memoryview, int], _Read]) -> None:
        self.body_type = body_type
        self.read = read


class ApiSpec:
    """One served API: its schema classes, the versions implemented and its handler, and
    for an API whose answers can be large, the most bytes a request's answer may hold,
    known before the handler runs (the connection budgets it while the request runs).

    Building one checks that the handler (and the bound) take the API's request class; the
    table of all APIs then holds them alike."""

    __slots__ = ("bound", "handler", "key", "max_version", "min_version", "name", "reader",
                 "request", "response")

    @overload
    def __init__(self, key: int, request: type[_Req], response: type[ApiMessage],
                 min_version: int, max_version: int, handler: Handler[_Req] | None,
                 bound: ResponseBound[_Req] | None = None) -> None: ...

    @overload
    def __init__(self, key: int, request: type[ApiMessage], response: type[ApiMessage],
                 min_version: int, max_version: int, handler: Handler[_Body] | None,
                 bound: ResponseBound[_Body] | None = None, *,
                 reader: BodyReader[_Body]) -> None: ...

    def __init__(self, key: int, request: type[ApiMessage], response: type[ApiMessage],
                 min_version: int, max_version: int, handler: Handler[_Body] | None,
                 bound: ResponseBound[_Body] | None = None, *,
                 reader: BodyReader[_Body] | None = None) -> None:
        self.key = key
        self.request: type[ApiMessage] = request
        self.response = response
        self.name: str = request.name.removesuffix("Request")
        """The API's protocol name, e.g. ``Produce``."""
        self.min_version = min_version
        self.max_version = max_version
        # the table holds every API alike: each handler is wrapped to take any message, and
        # checks that it got its own request class (the only one decoded for this API)
        self.reader: BodyReader[Body] | None = reader
        """Reads the bodies instead of the schema library (None: the library does)."""
        # the overloads tie the handler to the schema class, or to the reader's
        body_type = cast("type[_Body]", request if reader is None else reader.body_type)
        self.handler = None if handler is None else _taking_any(body_type, handler)
        self.bound = None if bound is None else _bound_taking_any(body_type, bound)



@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A decoded request; ``body`` is None for ApiVersions at a version we do not serve."""

    header: RequestHeader
    spec: ApiSpec
    body: Body | None
    size: int = 0
    """The frame's bytes (what a produce quota counts)."""


class Dispatcher:
    """Decodes requests, runs their handlers and encodes framed responses."""

    def __init__(self, engine: Engine, specs: Iterable[ApiSpec],
                 throttling: Throttling | None = None) -> None:
        self.engine = engine
        self.throttling = throttling
        self.specs: dict[int, ApiSpec] = {spec.key: spec for spec in specs}
        self.specs[API_VERSIONS_KEY] = ApiSpec(API_VERSIONS_KEY, ApiVersionsRequest,
                                               ApiVersionsResponse, 0, 4, None)
        self._api_versions: dict[tuple[int, ErrorCode], bytes] = {}

    def parse(self, frame: memoryview) -> ParsedRequest:
        """Decode a request frame (without its size prefix)."""
        key, version, correlation_id = peek_header(frame)
        spec = self.specs.get(key)
        if spec is None:
            raise ProtocolError(f"unknown or unsupported API key {key} "
                                f"(correlation id {correlation_id})")
        supported = spec.min_version <= version <= spec.max_version
        if not supported and key != API_VERSIONS_KEY:
            raise ProtocolError(f"{spec.name} v{version} is not supported "
                                f"(versions {spec.min_version}-{spec.max_version})")
        flexible = bool(spec.request.flexible_version_q(version)) if supported else version >= 3
        header, body_at = parse_header(frame, flexible)
        if not supported:
            return ParsedRequest(header, spec, None, len(frame))
        if spec.reader is not None:
            return ParsedRequest(header, spec, self._read(spec.reader, spec, frame[body_at:],
                                                          version), len(frame))
        try:
            body = spec.request.decode(frame[body_at:], version=version)
        except Exception as exc:  # the schema decoder raises many kinds on garbage
            raise ProtocolError(f"malformed {spec.name} v{version} request: {exc!r}") from exc
        null = first_forbidden_null(spec.request, version, body)
        if null is not None:  # Kafka's reader refuses it: the request does not parse
            raise ProtocolError(f"malformed {spec.name} v{version} request: non-nullable "
                                f"field {null} is null")
        return ParsedRequest(header, spec, body, len(frame))

    @staticmethod
    def _read(reader: BodyReader[Body], spec: ApiSpec, body: memoryview, version: int) -> Body:
        """A body read by the API's own reader, refused as the schema decoder's would be."""
        try:
            return reader.read(body, version)
        except ForbiddenNull as null:
            raise ProtocolError(f"malformed {spec.name} v{version} request: non-nullable "
                                f"field {null.path} is null") from None
        except Exception as exc:  # garbage: whatever the reading raised
            raise ProtocolError(f"malformed {spec.name} v{version} request: {exc!r}") from exc

    def response_bound(self, parsed: ParsedRequest) -> int:
        """The most bytes the framed response to ``parsed`` may hold."""
        if parsed.spec.bound is None or parsed.body is None:
            return SMALL_RESPONSE_BOUND
        return parsed.spec.bound(self.engine, parsed.body)

    def api_versions(self, version: int, error: ErrorCode = ErrorCode.NONE) -> bytes:
        """The encoded ApiVersions answer (no header) listing every served API and its
        versions: built once per version (every client asks, once per connection: ~50
        entries built each time were a fifth of a login's CPU, their encoding a tenth of
        what a login storm costs the loop); the served APIs are fixed at start."""
        found = self._api_versions.get((version, error))
        if found is not None:
            return found
        api_keys = [
            ApiVersionsResponse.ApiVersion(api_key=spec.key, min_version=spec.min_version,
                                           max_version=spec.max_version)
            for spec in sorted(self.specs.values(), key=lambda s: s.key)]
        body = bytes(ApiVersionsResponse(version=version, error_code=error, api_keys=api_keys,
                                         throttle_time_ms=0).encode())
        self._api_versions[(version, error)] = body
        return body

    async def dispatch(self, ctx: RequestContext, parsed: ParsedRequest,
                       mute: Mute | None = None) -> Answer:
        """Run the request's dispatch stage; return the framed response, None when none is
        due, or the waiting stage that gives either. A request over a quota is answered
        with its throttle time, and ``mute`` is told to stop reading the connection for
        that long (:mod:`broker_core.quotas.throttling`)."""
        header, spec = parsed.header, parsed.spec
        if spec.key == API_VERSIONS_KEY:
            body = (self.api_versions(0, ErrorCode.UNSUPPORTED_VERSION)
                    if parsed.body is None else self.api_versions(header.api_version))
            return frame_response(response_header(header.correlation_id, False), body)
        assert spec.handler is not None and parsed.body is not None  # ApiVersions alone lacks them
        started = time.perf_counter()
        response = await spec.handler(self.engine, ctx, parsed.body)
        throttle = None
        if self.throttling is not None:
            throttle = self.throttling.dispatched(ctx, spec.key, parsed.size,
                                                  time.perf_counter() - started)
        if isinstance(response, Later):
            return self._after(response, ctx, parsed, started, throttle, mute)
        return self._answer(response, ctx, parsed, started, throttle, mute)

    async def _after(self, later: Later[Response | None], ctx: RequestContext,
                     parsed: ParsedRequest, started: float, throttle: Throttle | None,
                     mute: Mute | None) -> Frame | None:
        """The waiting stage of a request: its response once ``later`` gives it."""
        return self._answer(await later.wait, ctx, parsed, started, throttle, mute)

    def _answer(self, response: Response | None, ctx: RequestContext, parsed: ParsedRequest,
                started: float, throttle: Throttle | None, mute: Mute | None) -> Frame | None:
        """The response throttled if it must be, then encoded."""
        if self.throttling is not None:
            response, throttle_ms = self.throttling.answered(ctx, response, throttle)
            if throttle_ms and mute is not None:
                mute(throttle_ms)
        return self._encode(response, parsed.header, parsed.spec, started)

    def _encode(self, response: Response | None, header: RequestHeader, spec: ApiSpec,
                started: float) -> Frame | None:
        """Count the request and frame its response (None when none is due)."""
        requests, latency = metrics.per_api(spec.name)
        requests.inc()
        latency.observe(time.perf_counter() - started)
        if response is None:
            return None
        flexible = bool(spec.response.flexible_version_q(header.api_version))
        head = response_header(header.correlation_id, flexible)
        if isinstance(response, Prewritten):
            parts, size = response.encode_parts()
            return frame_parts(head, parts, size)
        return frame_response(head, response.encode())
