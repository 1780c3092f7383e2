"""The per-connection session: the security gate in front of the engine.

On a SASL listener only ApiVersions (once), SaslHandshake and SaslAuthenticate are served,
in that order, until the client has logged in; anything else closes the connection. The
v0 handshake (raw SASL tokens after it) and KIP-368 re-authentication are supported; a
session that outlives its lifetime without re-authenticating is closed on its next
request, a late SaslHandshake included. Every login and
re-authentication also asks whether the role may use the tenant it names
(``login_refusal``, the policy's): a refusal is a failed login, before the connection counts
in the quotas on connections. The rules and the
login's progress are the sans-I/O :class:`sasl.connection_state.ConnectionSasl`; this module
does their I/O (the mechanism's steps in a worker thread, answers, audit, metrics, logs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from functools import partial

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from broker_core.codec.errors import ProtocolError
from broker_core.codec.framing import frame_response, response_header
from broker_core.context import Endpoint, RequestContext
from broker_core.dispatch import (
    API_VERSIONS_KEY,
    SMALL_RESPONSE_BOUND,
    Answer,
    ApiSpec,
    Dispatcher,
    ParsedRequest,
)
from broker_core.errors import CloseConnection, ErrorCode
from broker_core.naming import Namespace
from broker_core.quotas.entities import Caller
from common.frames import Frame
from edge.audit import AuditEvent, AuditLog
from edge.denials import LoginFailures
from edge.metrics import AUTHENTICATIONS, CONNECTIONS
from edge.quotas import ConnectionGate
from edge.security import ListenerSecurity, SaslFactory
from listeners.server import ConnectionInfo, ConnectionRefused, FrameError, Request
from listeners.tls import CertificateRefused, certificate_principal
from sasl.connection_state import ConnectionSasl, Handshake
from sasl.errors import MECHANISM_LIMIT, SaslFailure, SaslPending
from sasl.printable import printable
from sasl.types import Authenticated, SaslServer

log = logging.getLogger(__name__)
ANONYMOUS = "ANONYMOUS"
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36


def edge_apis() -> list[ApiSpec]:
    """The APIs the session answers itself (advertised by ApiVersions with the engine's)."""
    return [
        ApiSpec(SASL_HANDSHAKE, SaslHandshakeRequest, SaslHandshakeResponse, 0, 1, None),
        ApiSpec(SASL_AUTHENTICATE, SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2,
                None),
    ]


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _refuse(reason: str) -> None:
    """The answer to a frame that does not decode: the connection is closed."""
    raise FrameError(reason)


class Session:
    """One client connection's view of the broker."""

    def __init__(self, dispatcher: Dispatcher, info: ConnectionInfo, advertised: Endpoint,
                 home: Namespace, security: ListenerSecurity,
                 mechanisms: dict[str, SaslFactory], failed_delay_ms: int = 0,
                 max_reauth_ms: int = 0, audit: AuditLog | None = None,
                 max_receive_before_login: int | None = None,
                 gate: ConnectionGate | None = None,
                 steps: Executor | None = None,
                 login_refusal: Callable[[str, str, str], str | None] | None = None,
                 failures: LoginFailures | None = None) -> None:
        self.dispatcher = dispatcher
        self.info = info
        self.advertised = advertised
        self.default_home = home
        self.security = security
        self.mechanisms = mechanisms
        self.failed_delay_ms = failed_delay_ms
        self.audit = audit
        self.sasl = ConnectionSasl(security.sasl, max_reauth_ms)
        self.principal = ANONYMOUS
        """Who the connection acts as: a SASL login's role, a client certificate's
        principal (``tlsPrincipal``), else ANONYMOUS (no certificate)."""
        self.home = home
        self.max_receive_before_login = max_receive_before_login
        self.client_id: str | None = None
        """The client id of the connection's latest request (for log lines)."""
        self.gate = gate
        self.steps = steps
        """Where the mechanism's steps run (None: the loop's default executor)."""
        self.login_refusal = login_refusal
        """Why a role (from a host) may not use a tenant, or None (``Policy.login_refusal``):
        asked at each login, before the quotas on connections count it."""
        self.admitted: Caller | None = None
        """Who the connection counts for in the quotas on connections, once admitted."""
        self.failures = failures
        """Bounds the lines and audit events of failed logins per peer host and listener
        (None: every one is reported)."""
        self._failure_reported = True
        """Whether the latest failed login was reported (else the listener's closing line
        is left out too)."""
        self._refusal_challenged = False
        """Whether the login failed at an error challenge (RFC 7628): reported and delayed
        then, so that the client's reply ends it without either again."""
        self.muted_until = 0.0
        """Until when (``time.monotonic()``) the listener does not read the connection: a
        request over a quota mutes it for its throttle time (KIP-219)."""
        try:
            self.principal = certificate_principal(info.tls, security.tls_principal) or \
                ANONYMOUS
        except CertificateRefused as refused:
            self._refuse_certificate(str(refused))

    def _refuse_certificate(self, reason: str) -> None:
        """A verified client certificate that names no principal is a failed login
        (ConnectionRefused: the listener closes the connection after its handshake), not
        ANONYMOUS, which is for connections without a certificate: reported as every
        failed login, within the bounds of ``failures``."""
        if self._failure_counted():
            self._audit("authentication", "failure", mechanism="SSL", reason=reason)
            log.warning("client certificate from %s on %s refused: %s", self.info.peer,
                        self.info.listener, reason, extra=self._log_fields())
        raise ConnectionRefused(reason)

    @property
    def frame_limit(self) -> int | None:
        """Kafka's ``sasl.server.max.receive.size``: the frame limit on a SASL listener
        until the client has logged in (None: the listener's own limit)."""
        if self.sasl.gated:
            return self.max_receive_before_login
        return None

    def prepare(self, frame: memoryview) -> Request:
        """Decode one request frame; what its response may hold comes from the dispatcher
        (a Fetch's limits), the SASL answers are small."""
        if self.sasl.raw_tokens:
            return Request(SMALL_RESPONSE_BOUND, partial(self._raw_token, frame))
        try:
            parsed = self.dispatcher.parse(frame)
        except ProtocolError as exc:
            return Request(0, partial(_refuse, str(exc)))
        return Request(self.dispatcher.response_bound(parsed), partial(self._answer, parsed))

    async def _answer(self, parsed: ParsedRequest) -> Answer:
        """Answer one decoded request: the gate, the authorizer's context and the handler's
        dispatch stage run here, one request of the connection at a time (the listener's
        order rule); what a handler leaves for later comes back as its waiting stage."""
        key = parsed.header.api_key
        self.client_id = parsed.header.client_id
        if self.admitted is None and not self.security.sasl:
            await self._admit(parsed.header.client_id)  # no login: who connects is known now
        if self.sasl.expired(_now_ms(), key == SASL_AUTHENTICATE):
            self._audit("connection", "rejected", api=parsed.spec.name,
                        principal=self.principal, tenant=self.home.tenant,
                        reason="SASL session expired without re-authentication")
            raise FrameError(f"SASL session of {self.principal} expired without "
                             "re-authentication")
        if key == SASL_HANDSHAKE:
            return self._handshake(parsed)
        if key == SASL_AUTHENTICATE and self.sasl.takes_authenticate():
            return await self._authenticate(parsed)
        if self.sasl.gated:
            versions = key == API_VERSIONS_KEY
            refusal = self.sasl.before_login(versions, parsed.body is not None)
            if refusal is not None:
                reported = self._failure_counted()
                if reported:
                    self._audit("connection", "rejected", api=parsed.spec.name,
                                reason=refusal)
                raise FrameError(refusal if versions else f"{parsed.spec.name} {refusal}",
                                 logged=not reported)
        if key == SASL_AUTHENTICATE:
            return self._authenticate_when_authenticated(parsed)
        ctx = RequestContext(
            listener=self.info.listener, advertised=self.advertised, principal=self.principal,
            home=self.home, client_id=parsed.header.client_id,
            api_version=parsed.header.api_version,
            client_host=self.client_host,
            login_tenant=self.home.tenant if self.sasl.login is not None else None,
            api=parsed.spec.name,
        )
        try:
            return await self.dispatcher.dispatch(ctx, parsed, self._mute)
        except CloseConnection as close:  # the listener closes it, with one line
            raise FrameError(str(close)) from None

    @property
    def client_host(self) -> str:
        """The client's address without its port."""
        return self.info.peer.rsplit(":", 1)[0]

    async def _admit(self, client_id: str | None) -> None:
        """Count the connection in the quotas on connections (FrameError: refused)."""
        who = Caller(self.principal, client_id or "", self.home.tenant,
                     f"{self.home.tenant}/{self.home.namespace}")
        if self.gate is not None:
            await self.gate.admit(who, self.info)
        self.admitted = who

    def _failure_counted(self, tenant: str | None = None) -> bool:
        """Count a failed login (or a request before one) naming ``tenant``: whether it is
        reported (its audit event and lines written) or only counted, as ``failures``
        bounds them."""
        self._failure_reported = self.failures is None or self.failures.take(
            self.client_host, self.info.listener, self.info.peer, tenant)
        return self._failure_reported

    def _mute(self, throttle_ms: int) -> None:
        self.muted_until = max(self.muted_until, time.monotonic() + throttle_ms / 1000)

    def _audit(self, kind: str, outcome: str, *, mechanism: str | None = None,
               principal: str | None = None, tenant: str | None = None, api: str | None = None,
               reason: str | None = None) -> None:
        if self.audit is not None:
            self.audit.record(AuditEvent(
                kind=kind, outcome=outcome, listener=self.info.listener, client=self.info.peer,
                principal=principal, tenant=tenant, mechanism=mechanism, api=api,
                reason=reason))

    def _respond(self, parsed: ParsedRequest, response: ApiMessage) -> bytes:
        flexible = bool(parsed.spec.response.flexible_version_q(parsed.header.api_version))
        return frame_response(response_header(parsed.header.correlation_id, flexible),
                              response.encode())

    # -- SaslHandshake -------------------------------------------------------------------

    def _handshake(self, parsed: ParsedRequest) -> bytes:
        """Kafka's rules (SaslServerAuthenticator, KIP-368): a handshake starts a login, or
        a re-authentication of a session that has a lifetime; during an exchange it is
        ILLEGAL_SASL_STATE and closes the connection; on a connection that cannot
        re-authenticate (no SASL on the listener, a session without lifetime) it is
        answered ILLEGAL_SASL_STATE and the connection stays, as Kafka's request handler
        answers it."""
        version = parsed.header.api_version
        offered = list(self.security.mechanisms)

        def answer(code: ErrorCode, mechanisms: list[str] = offered) -> bytes:
            return self._respond(parsed, SaslHandshakeResponse(
                version=version, error_code=code, mechanisms=mechanisms))

        assert isinstance(parsed.body, SaslHandshakeRequest)
        mechanism = parsed.body.mechanism
        verdict = self.sasl.handshake(mechanism, version, offered)
        if verdict == Handshake.NOT_NOW:
            return answer(ErrorCode.ILLEGAL_SASL_STATE, [])
        if verdict == Handshake.DURING_EXCHANGE:
            assert self.sasl.exchange is not None
            reported = self._refused(mechanism, self.sasl.exchange.claimed_tenant,
                                     verdict.value)
            raise FrameError(verdict.value, answer(ErrorCode.ILLEGAL_SASL_STATE, []),
                             logged=not reported)
        if verdict == Handshake.UNSUPPORTED:
            reason = (f"SASL mechanism '{printable(mechanism, MECHANISM_LIMIT)}' is not "
                      f"enabled (enabled: {', '.join(offered)})")
            reported = self._refused(mechanism, self.home.tenant if self.sasl.login else None,
                                     reason)
            raise FrameError(reason, answer(ErrorCode.UNSUPPORTED_SASL_MECHANISM),
                             logged=not reported)
        if verdict == Handshake.WRONG_REAUTHENTICATION:
            reported = self._refused(mechanism, self.home.tenant, verdict.value)
            raise FrameError(verdict.value, answer(ErrorCode.ILLEGAL_SASL_STATE),
                             logged=not reported)
        self.sasl.begin(self.mechanisms[mechanism](), version)
        return answer(ErrorCode.NONE)

    def _refused(self, mechanism: str | None, tenant: str | None, reason: str) -> bool:
        """Audit a login attempt ended before any SASL step ran (the closing log line
        comes from the listener) if it is reported: whether it is."""
        if not self._failure_counted(tenant):
            return False
        self._audit("authentication", "failure", mechanism=mechanism, tenant=tenant,
                    reason=reason)
        return True

    # -- SaslAuthenticate ----------------------------------------------------------------

    async def _step(self, message: bytes, client_id: str | None
                    ) -> tuple[bytes, Authenticated | None]:
        """One SASL step; SaslFailure when it failed (the caller answers after
        ``failed_delay_ms``: :meth:`_failed`). A failure answered with an error challenge
        (``refused``) is reported here as it is answered, not again at the client's reply.
        SaslPending passes through (the step did not happen: :meth:`_when_ready`). A
        first login is admitted by the quotas on connections (FrameError: refused)."""
        server = self.sasl.exchange
        assert server is not None
        try:
            # In a worker thread: a token's signature check is CPU work (it never waits for
            # the issuer: SaslPending). (Run on the loop, logins went 4x slower in wall
            # time and 1.2x in CPU in bench.logins: kept in the thread.) The threads are
            # the SASL steps' own (``steps``), not the default executor's.
            challenge = await asyncio.get_running_loop().run_in_executor(
                self.steps, server.step, message)
            result = server.result if server.complete else None
            if result is not None:
                self.sasl.check(result)
                self._check_tenant(result)
        except SaslPending:
            raise
        except SaslFailure as failure:
            if not self._refusal_challenged:
                self._report_failure(server, failure.message)
            self.sasl.failed()
            raise
        refused = server.refused
        if refused is not None:
            self._report_failure(server, refused)
            self._refusal_challenged = True
            return challenge, None
        if result is None:
            return challenge, None
        AUTHENTICATIONS.labels(server.mechanism, "success").inc()
        self._logged_in(result)
        self._audit("authentication", "success", mechanism=server.mechanism,
                    principal=result.principal, tenant=self.home.tenant)
        if self.admitted is None:
            await self._admit(client_id)
        return challenge, result

    def _report_failure(self, server: SaslServer, reason: str) -> None:
        """Count a failed login; audit and log it if it is reported (``failures``)."""
        AUTHENTICATIONS.labels(server.mechanism, "failure").inc()
        tenant = server.claimed_tenant
        if self._failure_counted(tenant):
            self._audit("authentication", "failure", mechanism=server.mechanism,
                        tenant=tenant, reason=reason)
            log.warning("SASL %s login from %s (client id %s) on %s (tenant %s) failed: "
                        "%s", server.mechanism, self.info.peer, self.client_id,
                        self.info.listener, tenant or "not named", reason,
                        extra=self._log_fields(tenant=tenant))

    def _check_tenant(self, result: Authenticated) -> None:
        """Whether the role may use the tenant it logs in to (SaslFailure if not)."""
        if self.login_refusal is None:
            return
        tenant = result.tenant or self.default_home.tenant
        refusal = self.login_refusal(result.principal, tenant, self.client_host)
        if refusal is not None:
            raise SaslFailure(refusal)

    def _logged_in(self, result: Authenticated) -> None:
        first = self.sasl.login is None
        lifetime = self.sasl.succeeded(result, _now_ms())
        self.principal = result.principal
        self.home = Namespace(result.tenant or self.default_home.tenant,
                              result.namespace or self.default_home.namespace)
        log.info("%s %s as %s (tenant %s) on %s, session %s",
                 self.info.peer, "logged in" if first else "re-authenticated",
                 result.principal, self.home.tenant, self.info.listener,
                 f"{lifetime} ms" if lifetime else "without limit",
                 extra=self._log_fields(tenant=self.home.tenant, principal=result.principal))

    def _log_fields(self, **fields: str | None) -> dict[str, str | None]:
        """The ``extra`` fields of this connection's log lines (``logFormat=json``)."""
        return {"client": self.info.peer, "client_id": self.client_id,
                "listener": self.info.listener, **fields}

    async def _failed(self, error: FrameError) -> Answer:
        """A failed SASL step: ``failed_delay_ms`` (unless it was waited before the error
        challenge), then ``error`` (its answer, and the close)."""
        delay_ms = 0 if self._refusal_challenged else self.failed_delay_ms
        delayed = self._after_delay(error, delay_ms)
        del error  # a frame the error's traceback holds must not hold it: a reference cycle
        return await self._deferred(delayed)

    async def _deferred(self, later: Coroutine[object, None, Frame | None]) -> Answer:
        """``later`` (a wait of a login, then its answer): for a first login the waiting
        stage, so that it holds no permit of the login gate (``listeners.admission``) and
        no thread; the listener reads nothing more of a connection not logged in
        meanwhile. A re-authentication waits in the dispatch stage, so that nothing more
        is read and served in the old session."""
        if self.sasl.login is None:
            return later
        return await later

    async def _after_delay(self, error: FrameError, delay_ms: int) -> None:
        await asyncio.sleep(delay_ms / 1000)
        try:
            raise error
        finally:
            del error  # no reference cycle (the error's traceback holds this frame)

    async def _answer_after_delay(self, frame: bytes) -> bytes:
        await asyncio.sleep(self.failed_delay_ms / 1000)
        return frame

    async def _login_step(self, message: bytes, client_id: str | None,
                          answer: Callable[[bytes, int], bytes],
                          refusal: Callable[[str], bytes | None]) -> Answer:
        """One step of a login and its answer: ``answer(challenge, session lifetime)``;
        a failure closes the connection after ``failed_delay_ms`` with
        ``refusal(reason)`` as its last frame. An error challenge (a failed OAUTHBEARER
        login, RFC 7628) is answered after that delay, and the client's reply at once. A
        step that cannot be judged yet (SaslPending: the issuer's first keys) waits for
        them, a first login's in its waiting stage (:meth:`_when_ready`)."""
        try:
            challenge, result = await self._step(message, client_id)
        except SaslPending as pending:
            return await self._deferred(self._when_ready(
                pending.ready, pending.wait_seconds, message, client_id, answer, refusal))
        except SaslFailure as failure:
            return await self._failed(FrameError(
                f"authentication failed: {failure.message}", refusal(failure.message),
                logged=not self._failure_reported))
        lifetime = self.sasl.lifetime_left(_now_ms()) if result is not None else 0
        frame = answer(challenge, lifetime)
        if self._refusal_challenged:  # this step answered the error challenge
            return await self._deferred(self._answer_after_delay(frame))
        return frame

    async def _when_ready(self, ready: Future[None], wait_seconds: float, message: bytes,
                          client_id: str | None, answer: Callable[[bytes, int], bytes],
                          refusal: Callable[[str], bytes | None]) -> Frame | None:
        """Wait for what the step waits for (on the event loop, at most
        ``wait_seconds``), then step again; the mechanism refuses rather than wait twice."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.wrap_future(ready), wait_seconds)
        answered = await self._login_step(message, client_id, answer, refusal)
        return await answered if isinstance(answered, Coroutine) else answered

    async def _authenticate(self, parsed: ParsedRequest) -> Answer:
        version = parsed.header.api_version

        def answer(code: ErrorCode, message: str | None, auth: bytes = b"",
                   lifetime: int = 0) -> bytes:
            return self._respond(parsed, SaslAuthenticateResponse(
                version=version, error_code=code, error_message=message, auth_bytes=auth,
                session_lifetime_ms=lifetime))

        if self.sasl.authenticating() is None:
            reason = "SaslAuthenticate without a SaslHandshake"
            reported = self._refused(None, None, reason)
            raise FrameError(reason, answer(ErrorCode.ILLEGAL_SASL_STATE,
                                            "SaslAuthenticate must follow SaslHandshake"),
                             logged=not reported)
        assert isinstance(parsed.body, SaslAuthenticateRequest)
        auth = parsed.body.auth_bytes
        assert isinstance(auth, bytes)  # as decoded (an ApiData only goes out)
        return await self._login_step(
            auth, parsed.header.client_id,
            lambda challenge, lifetime: answer(ErrorCode.NONE, None, challenge, lifetime),
            lambda reason: answer(ErrorCode.SASL_AUTHENTICATION_FAILED,
                                  f"Authentication failed: {reason}"))

    def _authenticate_when_authenticated(self, parsed: ParsedRequest) -> bytes:
        """SaslAuthenticate on a connection that is logged in (and not re-authenticating)
        or needs no login: answered ILLEGAL_SASL_STATE, the connection stays (Kafka)."""
        return self._respond(parsed, SaslAuthenticateResponse(
            version=parsed.header.api_version, error_code=ErrorCode.ILLEGAL_SASL_STATE,
            error_message="SaslAuthenticate request received after successful authentication",
            auth_bytes=b"", session_lifetime_ms=0))

    async def _raw_token(self, frame: memoryview) -> Answer:
        """The v0 flow: the frame is a bare SASL token, answered with a bare token (a
        failure closes the connection without one)."""
        return await self._login_step(
            bytes(frame), None,
            lambda challenge, _lifetime: len(challenge).to_bytes(4, "big") + challenge,
            lambda _reason: None)

    def closed(self) -> None:
        """Count the connection out."""
        CONNECTIONS.labels(self.info.listener).dec()
        if self.admitted is not None and self.gate is not None:
            self.gate.release(self.admitted)
        log.debug("connection from %s on %s closed", self.info.peer, self.info.listener)
