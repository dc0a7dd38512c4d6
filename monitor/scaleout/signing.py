"""Authenticated publications: an HMAC-SHA256 over every record of the partials topic.

Anyone who may write to the partials topic could otherwise forge a replica's publication: move a
partition's resume position (the replicas skip records), erase a replica from the merge, seize a
stream's dimension. With ``scale_out.partials_key_file`` set, replicas sign every record they
publish (partials, tombstones, manifests) under the file's first key, and replicas and reducers
refuse a record that carries no signature (``unsigned``) or one no accepted key made
(``bad_signature``) before they decode anything of it (docs/deployment.md, "Securing the partials
topic").

The signature covers what a reader acts on: the record key, the value (or that there is none),
and the ``embmon-kind``, ``embmon-epoch`` and ``embmon-chunk`` headers, each length-prefixed so no
two different records share the signed bytes. It does not cover the partition: a replica that
completes another's seal writes the same record to other partitions, signature included.

The key file holds one key per line (at least 32 characters each after stripping; blank lines and
``#`` comments are skipped). The first signs; every line is accepted. Rotating: add the new key as
a second line everywhere, restart; move it first, restart; drop the old line once every replica
republished in full (``scale_out.full_publish_seconds``) and the old records left the window.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monitor.scaleout.settings import ScaleOutSettings

logger = logging.getLogger(__name__)

MAC_HEADER = "embmon-mac"
SIGNED_HEADERS = ("embmon-kind", "embmon-epoch", "embmon-chunk")
MIN_KEY_CHARS = 32
MAX_KEYS = 16
_DOMAIN = b"embedding-monitor partials v1\0"
_NONE = b"\xff" * 8  # a length no real field has: "no value" (a tombstone) differs from an empty one


def warn_if_unsigned(scale: ScaleOutSettings) -> None:
    """One warning at start-up when the partials topic is not authenticated (no key file), and
    when no trusted replica list narrows whose publications count."""
    if scale.partials_key_file is None:
        logger.warning(
            "scale_out.partials_key_file is unset: publications on %s are neither signed nor checked, so anyone "
            "who may write to the topic can forge a replica's (docs/deployment.md, \"Securing the partials topic\")%s",
            scale.partials_topic,
            "; scale_out.replicas is empty too: any replica id is merged" if not scale.replicas else "")


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file, never its content."""


def read_key_file(path: Path) -> tuple[bytes, ...]:
    """The keys in ``path``, the signing key first. Raises :class:`KeyFileError`."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise KeyFileError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"{path} is not UTF-8 text") from None
    keys = tuple(line.strip().encode() for line in text.splitlines()
                 if line.strip() and not line.strip().startswith("#"))
    if not keys:
        raise KeyFileError(f"{path} holds no key (one per line, the first signs)")
    if len(keys) > MAX_KEYS:
        raise KeyFileError(f"{path} holds {len(keys)} keys, at most {MAX_KEYS}")
    for number, key in enumerate(keys, start=1):
        if len(key) < MIN_KEY_CHARS:
            raise KeyFileError(f"{path}: key {number} has {len(key)} characters, at least {MIN_KEY_CHARS} "
                               "(python -c 'import secrets; print(secrets.token_urlsafe(32))' makes one)")
    return keys


def _field(data: bytes | None) -> bytes:
    if data is None:
        return _NONE
    return len(data).to_bytes(8, "big") + data


def signed_bytes(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> bytes:
    """What the signature covers (module docstring)."""
    found: dict[str, bytes | None] = dict.fromkeys(SIGNED_HEADERS)
    for name, raw in headers:
        if name in found:
            if found[name] is not None:  # two of one header: no reader may pick another than was signed
                return b""
            found[name] = bytes(raw) if raw is not None else b""
    return _DOMAIN + b"".join(_field(part) for part in (key, value, *found.values()))


def sign(keys: Sequence[bytes], key: bytes | None, value: bytes | None,
         headers: Sequence[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    """``headers`` with the signature under the first of ``keys`` added (unchanged without keys)."""
    kept = tuple((n, v) for n, v in headers if n != MAC_HEADER)
    if not keys:
        return kept
    mac = hmac.new(keys[0], signed_bytes(key, value, kept), hashlib.sha256).hexdigest().encode()
    return (*kept, (MAC_HEADER, mac))


def refusal(keys: Sequence[bytes], key: bytes | None, value: bytes | None,
            headers: Sequence[tuple[str, bytes]]) -> str | None:
    """Why a record must be refused (``unsigned``, ``bad_signature``), or None when it may be read
    (always without keys)."""
    if not keys:
        return None
    macs = [raw for name, raw in headers if name == MAC_HEADER]
    if not macs:
        return "unsigned"
    if len(macs) != 1:
        return "bad_signature"
    data = signed_bytes(key, value, [(n, v) for n, v in headers if n != MAC_HEADER])
    if not data:
        return "bad_signature"
    given = bytes(macs[0] or b"")
    for secret in keys:
        if hmac.compare_digest(hmac.new(secret, data, hashlib.sha256).hexdigest().encode(), given):
            return None
    return "bad_signature"
