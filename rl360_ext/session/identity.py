"""What names a session and what makes two requests the same request.

Owns session ids that name the server process that minted them (`mint_session_id`, `minted_by`:
a restarted server tells a lost session from an unknown one) and `request_fingerprint`, the key a
retried chat request is matched to its recorded turn by.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

import orjson

_MINTED_ID = re.compile(r"[0-9a-f]{32}")


def _id_check(tag: str, body: str) -> str:
    return hashlib.blake2b((tag + body).encode(), digest_size=2).hexdigest()


def mint_session_id(instance_tag: str) -> str:
    """32 hex digits: this process's 8-digit tag, 20 random digits, a 4-digit check of both."""
    body = secrets.token_hex(10)
    return instance_tag + body + _id_check(instance_tag, body)


def minted_by(session_id: str) -> str | None:
    """The instance tag of an id `mint_session_id` made (any process), else None."""
    if not _MINTED_ID.fullmatch(session_id):
        return None
    tag, body, check = session_id[:8], session_id[8:28], session_id[28:]
    return tag if _id_check(tag, body) == check else None


def request_fingerprint(body: dict[str, Any]) -> bytes:
    """What makes two chat requests the same request (a client's retry): the body, less `stream`."""
    same = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return hashlib.blake2b(orjson.dumps(same, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
