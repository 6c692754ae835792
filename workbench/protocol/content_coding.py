"""A whole HTTP body's ``content-encoding``, undone within the inflate budgets.

One rule for every source that sees whole bodies (live capture of unary calls and BidiAppends,
flow/HAR imports): the codings are undone through ``workbench.wire.inflate`` (never unbounded), and
a body that would inflate past a budget becomes one ``compressed`` frame naming the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workbench.decode.classify import COMPRESSED, Frame
from workbench.redact import marker
from workbench.wire.envelope import FLAG_COMPRESSED, HEADER_LEN
from workbench.wire.inflate import InflateOverBudget, current_budget

# ``frames.meta`` key of a body kept with its HTTP content-coding (over an inflate budget).
CONTENT_ENCODING = "content_encoding"

# What one envelope of an inflated body costs the budget on top of its bytes: about what its frame
# holds in memory until the session is stored. A few KB of gzip inflate to megabytes of empty
# envelopes (5 zero bytes each), millions of frames: the bytes alone would pass the budget.
ENVELOPE_COST = 512


@dataclass
class UndoneBody:
    """What became of one body: ``plain`` bytes (``problem`` set when the coding could not be
    undone and ``plain`` is the body as it was), or ``kept``, the one frame that stands for it."""

    plain: bytes
    kept: Frame | None = None
    problem: str | None = None


def envelopes_over(body: bytes, most: int) -> bool:
    """Whether ``body``, read as envelopes, holds more than ``most`` of them (stops counting there)."""
    pos = n = 0
    while pos + HEADER_LEN <= len(body):
        n += 1
        if n > most:
            return True
        pos += HEADER_LEN + int.from_bytes(body[pos + 1 : pos + HEADER_LEN], "big")
    return False


def kept_body_frame(label: str, body: bytes, codings: Sequence[str], why: str, *, unary: bool,
                    msg_type: str | None, ident: str) -> Frame:
    """One ``compressed`` frame for a content-coded body past a budget.

    A unary body is one message of a known type: kept as it crossed the wire (flag 0x01 for gzip,
    so the views inflate it on demand, and the store's gate scrubs it by that type). A body of
    envelopes (a stream) is no one message: nothing could look in it for credentials without
    inflating it past the budget, so only its hash is stored, never the bytes.
    """
    coding = ", ".join(codings)
    meta = {CONTENT_ENCODING: coding}
    if unary:
        flags = FLAG_COMPRESSED if list(codings) in (["gzip"], ["x-gzip"]) else 0
        return Frame(COMPRESSED, f"{label} {len(body):,} bytes ({coding}) kept compressed (over an inflate budget)",
                     body, flags=flags, msg_type=msg_type, error=f"{ident}: {why}", meta=meta)
    why = why.split("; kept compressed")[0]
    return Frame(COMPRESSED, f"{label} {len(body):,} bytes ({coding}) over an inflate budget, stored as a hash",
                 marker(body).encode(), error=f"{ident}: {why}; stored as a hash ({len(body):,} bytes): "
                 "a body of envelopes that is not inflated cannot be searched for credentials", meta=meta)


def undo_body(body: bytes, codings: Sequence[str], *, session_key: str, side: str, unary: bool,
              msg_type: str | None, ident: str) -> UndoneBody:
    """Undo ``codings`` (as applied, ``codings_of``) of one whole body within the budgets in scope."""
    label = f"{'request' if side == 'client' else 'response'} body"
    budget = current_budget().session(session_key)
    room, name = budget.room()
    try:
        plain = budget.decode(body, list(codings), what=f"the {label}")
        if envelopes_over(plain, (room - len(plain)) // ENVELOPE_COST):
            raise InflateOverBudget(
                f"not inflated: the {label} ({len(body):,} bytes, {', '.join(codings)}) inflates to "
                f"{len(plain):,} bytes holding more envelopes than fit {name} at {ENVELOPE_COST} bytes "
                f"each; kept compressed, inflated when the frame is viewed")
    except InflateOverBudget as exc:
        return UndoneBody(b"", kept=kept_body_frame(label, body, codings, str(exc), unary=unary,
                                                   msg_type=msg_type, ident=ident))
    except ValueError as exc:
        return UndoneBody(body, problem=f"has content-encoding {', '.join(codings)} that cannot be undone ({exc})")
    return UndoneBody(plain)
