"""``sasl.jaas.config`` in the admin command's client properties, as Java clients write
their PLAIN login: ``org.apache.kafka.common.security.plain.PlainLoginModule required
username="alice" password="secret";``.

Kafka's option syntax (``JaasConfig``, on ``java.io.StreamTokenizer``): one login module,
its control flag (``required``, ``requisite``, ``sufficient`` or ``optional``), then
``key=value`` options up to a ``;``. A value is a word or a string quoted by ``"`` or
``'``, in which a backslash escapes the next character (``\\"``; ``\\n`` and its kin are
control characters). ``//`` and ``/* */`` comments are skipped, as Kafka's tokenizer
skips them. The PLAIN module's ``username`` and ``password`` become ``sasl.username`` and
``sasl.password``; any other module is a usage error saying what to write instead.
Messages name keys, never values: a password is never printed.
"""

from __future__ import annotations

from collections.abc import Iterator

from edge.admin.errors import UsageError

KEY = "sasl.jaas.config"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_FLAGS = ("required", "requisite", "sufficient", "optional")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_PUNCTUATION = "=;"
_Token = tuple[str, str]
"""(kind, text): kind ``word``, ``quoted`` or the punctuation character itself."""


def _word_char(char: str) -> bool:
    return char.isalnum() or char in "._-$" or ord(char) >= 128


def _comment_end(text: str, at: int) -> int:
    """Where the comment starting at ``at`` ends (``at`` itself when none starts)."""
    if text.startswith("//", at):
        end = text.find("\n", at)
        return len(text) if end < 0 else end
    if text.startswith("/*", at):
        end = text.find("*/", at + 2)
        if end < 0:
            raise UsageError(f"{KEY}: a /* comment is not closed")
        return end + 2
    return at


def _quoted(text: str, at: int) -> tuple[str, int]:
    """The quoted string starting at ``at`` (its quote) and where it ends."""
    quote, i = text[at], at + 1
    out: list[str] = []
    while i < len(text):
        char = text[i]
        if char == quote:
            return "".join(out), i + 1
        if char == "\\" and i + 1 < len(text):
            i += 1
            out.append(_ESCAPES.get(text[i], text[i]))
        else:
            out.append(char)
        i += 1
    raise UsageError(f"{KEY}: a quoted value is not closed")


def _tokens(text: str) -> Iterator[_Token]:
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif (end := _comment_end(text, i)) != i:
            i = end
        elif char in "\"'":
            value, i = _quoted(text, i)
            yield "quoted", value
        elif _word_char(char):
            start = i
            while i < len(text) and _word_char(text[i]):
                i += 1
            yield "word", text[start:i]
        elif char in _PUNCTUATION:
            i += 1
            yield char, char
        else:
            raise UsageError(f"{KEY}: a character outside quotes that Kafka's syntax does "
                             "not take (quote values: key=\"value\")")


def parse_jaas(text: str) -> tuple[str, dict[str, str]]:
    """The login module and its options of a one-module ``sasl.jaas.config`` value."""
    tokens = list(_tokens(text))
    if not tokens or tokens[0][0] != "word":
        raise UsageError(f"{KEY}: no login module named")
    module = tokens[0][1]
    if len(tokens) < 2 or tokens[1][0] != "word" or tokens[1][1].lower() not in _FLAGS:
        raise UsageError(f"{KEY}: the login module's control flag ({', '.join(_FLAGS)}) is "
                         "missing")
    options: dict[str, str] = {}
    i = 2
    while i < len(tokens) and tokens[i][0] != ";":
        key = tokens[i][1]
        if tokens[i][0] != "word":
            raise UsageError(f"{KEY}: an option name is missing before a quoted value")
        if i + 2 >= len(tokens) or tokens[i + 1][0] != "=" \
                or tokens[i + 2][0] not in ("word", "quoted"):
            raise UsageError(f"{KEY}: no value for option {key!r}")
        options[key] = tokens[i + 2][1]
        i += 3
    if i >= len(tokens):
        raise UsageError(f"{KEY}: the login module's options do not end with ';'")
    if i + 1 < len(tokens):
        raise UsageError(f"{KEY}: one login module only (Kafka clients take one)")
    return module, options


def plain_login(text: str) -> tuple[str, str]:
    """The username and password of a ``PlainLoginModule`` entry; UsageError for another
    login module, saying what to write instead."""
    module, options = parse_jaas(text)
    if module == OAUTH_MODULE:
        raise UsageError(f"{KEY}: OAuthBearerLoginModule is not read here: set "
                         "sasl.mechanism=OAUTHBEARER with sasl.oauthbearer.token.endpoint.url, "
                         "sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret "
                         "instead (the admin command fetches its tokens itself)")
    if module != PLAIN_MODULE:
        raise UsageError(f"{KEY}: login module {module!r} is not supported here (only "
                         f"{PLAIN_MODULE}, for sasl.mechanism=PLAIN)")
    missing = [key for key in ("username", "password") if key not in options]
    if missing:
        raise UsageError(f"{KEY}: PlainLoginModule needs {' and '.join(missing)}")
    return options["username"], options["password"]
