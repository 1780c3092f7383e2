"""The ACL bindings indexed for authorization checks.

A check names a tenant, a resource type, a name, a principal, a host and an operation;
the bindings that can speak about it are those of that tenant, resource type and principal
(or ``User:*``) whose pattern covers the name: a LITERAL binding on the name or on ``*``,
and the PREFIXED bindings whose prefix starts the name. :class:`AclIndex` finds exactly
those, so a check costs the length of its name plus the bindings that match, not the
number of bindings stored (a scan of every binding of every tenant per check made a
request naming 20,000 groups against 20,000 ACLs stall the event loop for half a minute).
The index is built once per set of bindings (the store rebuilds it when they change); it
is never edited.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from edge.acls import WILDCARD, AclBinding, AclOperation, AclPattern, AclPermission, AclResource


class _PrefixTree:
    """PREFIXED bindings by their prefix, in a radix tree (an edge carries a run of
    characters, a node exists only where a prefix ends or two prefixes part): the prefixes
    of a name are found in one walk along it, one step per node on its path, and the tree
    holds at most two nodes per prefix whatever their lengths."""

    __slots__ = ("bindings", "edges")

    def __init__(self) -> None:
        self.edges: dict[str, tuple[str, _PrefixTree]] = {}
        """The first character of an edge -> (its characters, the node below)."""
        self.bindings: list[AclBinding] = []
        """The bindings whose prefix ends at this node."""

    def add(self, prefix: str, binding: AclBinding) -> None:
        """Store ``binding`` under ``prefix``."""
        node, at = self, 0
        while at < len(prefix):
            edge = node.edges.get(prefix[at])
            if edge is None:
                leaf = _PrefixTree()
                node.edges[prefix[at]] = (prefix[at:], leaf)
                node, at = leaf, len(prefix)
                break
            label, child = edge
            shared = _shared_length(label, prefix, at)
            if shared < len(label):  # the prefix parts from the edge inside it: split it
                middle = _PrefixTree()
                middle.edges[label[shared]] = (label[shared:], child)
                node.edges[prefix[at]] = (label[:shared], middle)
                child = middle
            node, at = child, at + shared
        node.bindings.append(binding)

    def covering(self, name: str) -> Iterator[list[AclBinding]]:
        """The bindings of every stored prefix of ``name`` (``name`` itself included)."""
        node, at = self, 0
        while True:
            if node.bindings:
                yield node.bindings
            if at >= len(name):
                return
            edge = node.edges.get(name[at])
            if edge is None or not name.startswith(edge[0], at):
                return
            at += len(edge[0])
            node = edge[1]


def _shared_length(label: str, text: str, at: int) -> int:
    """How many leading characters ``label`` shares with ``text[at:]`` (at least one: the
    edge was found by its first character), by bisection with ``startswith``."""
    low, high = 1, min(len(label), len(text) - at)
    while low < high:
        middle = (low + high + 1) // 2
        if text.startswith(label[:middle], at):
            low = middle
        else:
            high = middle - 1
    return low


class _Scope:
    """The bindings of one tenant, resource type and principal."""

    __slots__ = ("everything", "literal", "prefixed")

    def __init__(self) -> None:
        self.literal: dict[str, list[AclBinding]] = {}
        self.prefixed: _PrefixTree | None = None
        self.everything: list[AclBinding] = []
        """Every binding of the scope, whatever its name."""

    def add(self, binding: AclBinding) -> None:
        self.everything.append(binding)
        if binding.pattern == AclPattern.PREFIXED:
            if self.prefixed is None:
                self.prefixed = _PrefixTree()
            self.prefixed.add(binding.name, binding)
        else:
            self.literal.setdefault(binding.name, []).append(binding)

    def covering(self, name: str) -> Iterator[list[AclBinding]]:
        """The bindings whose pattern covers ``name``, in groups."""
        exact = self.literal.get(name)
        if exact is not None:
            yield exact
        if name != WILDCARD:
            anything = self.literal.get(WILDCARD)
            if anything is not None:
                yield anything
        if self.prefixed is not None:
            yield from self.prefixed.covering(name)


class AclIndex:
    """Bindings by (tenant, resource type, principal), then by name or prefix."""

    def __init__(self, bindings: Iterable[AclBinding]) -> None:
        self._scopes: dict[tuple[str, AclResource, str], _Scope] = {}
        for binding in bindings:
            key = (binding.tenant, binding.resource, binding.principal)
            scope = self._scopes.get(key)
            if scope is None:
                scope = self._scopes[key] = _Scope()
            scope.add(binding)

    def _scopes_of(self, tenant: str | None, resource: AclResource,
                   principal: str) -> Iterator[_Scope]:
        """The scopes of ``principal`` (and ``User:*``) for a resource type, in ``tenant``
        (None: in every tenant, a walk over the scopes, not the bindings)."""
        whos = (principal, "User:*") if principal != "User:*" else (principal,)
        if tenant is None:
            yield from (scope for (_, kind, who), scope in self._scopes.items()
                        if kind == resource and who in whos)
            return
        for who in whos:
            scope = self._scopes.get((tenant, resource, who))
            if scope is not None:
                yield scope

    def allows_something(self, tenant: str, principal: str, host: str) -> bool:
        """Whether an ALLOW binding of ``tenant`` (any resource, operation or pattern)
        applies to ``principal`` from ``host``."""
        return any(binding.permission == AclPermission.ALLOW
                   and binding.host in (host, WILDCARD)
                   for resource in AclResource
                   for scope in self._scopes_of(tenant, resource, principal)
                   for binding in scope.everything)

    def decide_any(self, tenant: str | None, resource: AclResource, principal: str,
                   host: str, operation: AclOperation) -> bool:
        """Kafka's ``authorizeByResourceType``: whether some resource of the type (of
        ``tenant``; None: of any tenant) may get ``operation``: an ALLOW binding that no
        DENY covers (a DENY of the wildcard, or of a prefix of the ALLOW's name, or of the
        very name of a LITERAL ALLOW)."""
        allows: list[AclBinding] = []
        denies: list[AclBinding] = []
        for scope in self._scopes_of(tenant, resource, principal):
            for binding in scope.everything:
                if binding.host not in (host, WILDCARD) or \
                        binding.operation not in (AclOperation.ALL, operation):
                    continue
                (denies if binding.permission == AclPermission.DENY else allows).append(binding)

        def taken_back(allow: AclBinding) -> bool:
            return any(
                deny.tenant == allow.tenant and (
                    (deny.pattern == AclPattern.LITERAL and deny.name == WILDCARD)
                    or (deny.pattern == AclPattern.PREFIXED and allow.name.startswith(deny.name))
                    or (deny.pattern == allow.pattern == AclPattern.LITERAL
                        and deny.name == allow.name))
                for deny in denies)
        return any(not taken_back(allow) for allow in allows)

    def decide(self, tenant: str, resource: AclResource, name: str, principal: str,
               host: str, operation: AclOperation) -> bool:
        """Kafka's rule: any matching DENY refuses; else any matching ALLOW grants."""
        allowed = False
        for scope in self._scopes_of(tenant, resource, principal):
            for group in scope.covering(name):
                for binding in group:
                    if binding.host not in (host, WILDCARD) or not binding.grants(operation):
                        continue
                    if binding.permission == AclPermission.DENY:
                        return False
                    allowed = True
        return allowed
