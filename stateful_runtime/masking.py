"""Secrets: which config keys hold one, and masking their values wherever text is shown.

This module is the one place that decides what is secret. Everything that prints, logs, stores
or shows configuration goes through it: the registry (:func:`mask_config`), ``srt``'s output
and errors (:func:`mask_data`, :func:`mask_text`, :class:`MaskingStream`), the launcher's log
line, ``explain``, the Kafka client's ``describe()``, Dagster's run logs and metadata.

* **By key** — :func:`is_secret_key`: passwords, secrets, tokens, credentials, private keys,
  key names such as ``access_key``/``secret_key``/``api_key``, every ``sasl.*`` setting but the
  plain ones (mechanism, user name), ``ssl.key*``. Names of files and paths
  (``*.location``, ``*_file``, ``*_path``) are references, not secrets.
* **Inside values** — a password in a URL's user info (``postgresql://u:pw@host/db``,
  ``clickhouse://u:pw@...``), and ``name=value`` pairs with a secret name inside a longer
  string (a command line, a libpq DSN ``host=h password=pw``).
* **By value** — every secret value seen (through :func:`remember`, which the functions above
  call) is masked wherever it appears later in any text: a message, a command line, a
  traceback. Values shorter than :data:`MIN_REMEMBERED` characters are masked by key only
  (masking ``ab`` in every text would garble it), and values shorter than
  :data:`MIN_INSIDE_WORDS` only where they stand alone: a 4-digit PIN ``0000`` is masked in
  ``pin 0000`` but not inside the timestamp ``20261202T000047`` (a coincidence, not a leak).

An ``env:NAME`` value is a reference, shown as it is; the value it resolves to is remembered
where it is read (:func:`resolve`).

Secrets reach child processes through the environment, never their argv:
:func:`split_overrides` separates ``--set`` overrides whose values are (or contain) secrets,
:func:`child_env` puts them in :data:`ENV_VAR` as JSON, and :func:`take_env_overrides` reads and
removes it in the child (so Spark's JVM and Python workers do not inherit it).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from typing import IO, Any

from stateful_runtime.exceptions import ConfigError

MASK = "***"
# ``--set`` overrides holding secrets, as JSON {key: value}, from a parent srt to a child.
ENV_VAR = "SRT_SECRET_SETS"
# Shorter secrets are masked by key only: replacing a 1-3 character value in every text
# would garble the text and a 3-character secret is no secret anyway.
MIN_REMEMBERED = 4
# Shorter secrets are masked only where no letter or digit adjoins them; longer ones wherever
# they appear (inside a longer word they are no coincidence).
MIN_INSIDE_WORDS = 8

_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "credential",
    "private",
    "keystore",
    "jaas",
    "apikey",
    "accesskey",
    "secretkey",
)
# ``<qualifier>_key`` names: access_key, secret_key, api_key, private_key, aws_secret_access_key
_KEY_QUALIFIERS = (
    "access",
    "secret",
    "api",
    "private",
    "account",
    "session",
    "master",
    "encryption",
    "signing",
    "client",
    "auth",
    "shared",
)
# sasl.* settings that are plain words, not secrets.
_SASL_PLAIN = (
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.kerberos.service.name",
    "sasl.kerberos.principal",
    "sasl.kerberos.kinit.cmd",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.extensions",
)
# Names of files, paths and directories: they point at a secret, they are not one.
_REFERENCE_SUFFIXES = ("location", "file", "path", "dir", "filename")

_URL_USERINFO = re.compile(r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<pw>[^\s@/]+)@")
# ``name=value`` / ``name: value`` inside text (command lines, libpq DSNs, messages).
_PAIR = re.compile(
    r"(?P<key>[A-Za-z_][\w.-]*)(?P<sep>['\"]?\s*[=:]\s*)(?P<q>['\"]?)"
    r"(?P<val>[^\s'\",;&}]+)"
)

_lock = threading.Lock()
_remembered: set[str] = set()


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[._\-\s]+", name.lower()) if t]


def is_secret_key(name: str) -> bool:
    """True if a setting called ``name`` holds a secret (see the module docstring)."""
    lowered = name.lower()
    tokens = _tokens(lowered)
    if not tokens or tokens[-1] in _REFERENCE_SUFFIXES:
        return False
    if lowered.removeprefix("kafka.") in _SASL_PLAIN:
        return False
    if lowered.removeprefix("kafka.").startswith("sasl."):
        return True
    if lowered.removeprefix("kafka.").startswith("ssl.key"):
        return True
    joined = "".join(tokens)
    if any(w in joined for w in _WORDS):
        return True
    for i, t in enumerate(tokens):
        if t == "key" and i > 0 and tokens[i - 1] in _KEY_QUALIFIERS:
            return True
        if t.endswith("key") and t[:-3] in _KEY_QUALIFIERS:
            return True
    return False


def is_reference(value: Any) -> bool:
    """``env:NAME``: a pointer to a secret in the environment, not the secret."""
    return isinstance(value, str) and value.startswith("env:")


def remember(value: Any) -> None:
    """Mask ``value`` wherever it appears in text from now on (in this process)."""
    if value is None:
        return
    text = str(value)
    if len(text) >= MIN_REMEMBERED and not is_reference(text):
        with _lock:
            _remembered.add(text)


def url_password(value: str) -> str | None:
    """The password in a URL's user info, if any (``postgresql://u:pw@h/db`` → ``pw``)."""
    m = _URL_USERINFO.search(value)
    return m.group("pw") if m else None


def remember_config(config: Mapping[str, Any]) -> None:
    """Remember every secret value of ``config``: secret keys' values, URL passwords, and the
    environment values ``env:NAME`` references of secret keys point at."""
    for key, value in config.items():
        if value is None or value == "":
            continue
        if is_secret_key(str(key)):
            if is_reference(value):
                remember(os.environ.get(str(value)[4:]))
            else:
                remember(value)
        if isinstance(value, str):
            for m in _URL_USERINFO.finditer(value):
                remember(m.group("pw"))


def resolve(key: str, value: Any) -> Any:
    """``env:NAME`` → the environment variable's value (remembered as a secret); anything else
    as it is (remembered if ``key`` is secret)."""
    if is_reference(value):
        name = value[4:]
        if name not in os.environ:
            raise ConfigError(f"{key}=env:{name}: environment variable {name} is not set")
        value = os.environ[name]
        remember(value)
    elif is_secret_key(key):
        remember(value)
    return value


def mask_value(key: str, value: Any) -> Any:
    """``value`` as shown for setting ``key``: ``***`` if the key is secret (an ``env:NAME``
    reference stays), URL passwords and remembered secrets masked inside strings."""
    if value is None or value == "":
        return value
    if is_secret_key(str(key)) and not is_reference(value):
        if isinstance(value, Mapping | list | tuple):
            return mask_data(value)
        remember(value)
        return MASK
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Mapping | list | tuple):
        return mask_data(value)
    return value


def mask_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config mapping as it may be shown or stored: every secret masked."""
    remember_config(config)
    return {k: mask_value(str(k), v) for k, v in config.items()}


def mask_data(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with every secret masked: values of secret
    keys, and secrets inside strings."""
    if isinstance(value, Mapping):
        return {k: mask_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_data(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def _mask_pair(m: re.Match[str]) -> str:
    if not is_secret_key(m.group("key")) or is_reference(m.group("val")):
        return m.group(0)
    remember(m.group("val"))
    return f"{m.group('key')}{m.group('sep')}{m.group('q')}{MASK}"


def mask_text(text: str) -> str:
    """``text`` with URL passwords, secret ``name=value`` pairs and every remembered secret
    value replaced by ``***``."""
    if not text:
        return text
    for m in _URL_USERINFO.finditer(text):
        remember(m.group("pw"))
    text = _URL_USERINFO.sub(lambda m: f"{m.group('pre')}{MASK}@", text)
    text = _PAIR.sub(_mask_pair, text)
    with _lock:
        known = sorted(_remembered, key=len, reverse=True)
    for secret in known:
        if secret in text:
            if len(secret) >= MIN_INSIDE_WORDS:
                text = text.replace(secret, MASK)
            else:
                text = re.sub(_standing_alone(secret), MASK, text)
    return text


def _standing_alone(secret: str) -> str:
    """A pattern for ``secret`` where no letter or digit adjoins it."""
    return rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])"


def holds_secret(key: str, value: Any) -> bool:
    """True if passing ``key=value`` on a command line would show a secret."""
    if value is None or value == "" or is_reference(value):
        return False
    if is_secret_key(key):
        return True
    return isinstance(value, str) and url_password(value) is not None


def split_overrides(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(public, hidden)``: overrides safe on a command line, and those holding a secret (to
    pass through :func:`child_env`)."""
    public: dict[str, Any] = {}
    hidden: dict[str, str] = {}
    for k, v in config.items():
        if holds_secret(str(k), v):
            hidden[str(k)] = str(v)
            remember_config({k: v})
        else:
            public[k] = v
    return public, hidden


def child_env(hidden: Mapping[str, str]) -> dict[str, str]:
    """Environment entries carrying ``hidden`` overrides to a child ``srt`` process."""
    return {ENV_VAR: json.dumps(dict(hidden))} if hidden else {}


def take_env_overrides(environ: Any = None) -> dict[str, str]:
    """The overrides a parent passed in :data:`ENV_VAR`, removed from the environment (so the
    processes this one starts do not inherit them) and remembered as secrets."""
    env = os.environ if environ is None else environ
    raw = env.pop(ENV_VAR, None)
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise ConfigError(
            f"{ENV_VAR} is not JSON; it carries --set overrides from a parent "
            f'srt process as {{"key": "value"}}'
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{ENV_VAR} must be a JSON object of --set overrides")
    out = {str(k): str(v) for k, v in data.items()}
    remember_config(out)
    return out


class MaskingStream:
    """A text stream that masks secrets in everything written to it (``srt``'s stdout and
    stderr)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_text(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
