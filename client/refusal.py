"""A silo's refusal: one line, sent back as the reply's error, with no traceback on the silo.

A silo refuses a message when its own rules forbid it (its policy, client/silo_policy.py) or when the
protocol forbids it (secure aggregation's checks, client/secure_aggregation.py). Such a refusal is
not a fault of the ClientApp: Flower would log the raise with its traceback and send the reason
as ``<class '...'>:<'...'>``. :func:`refusal_mod`, the ClientApp's outermost mod, sends the
refusal's own line instead, with Flower's error code for a mod's failed precondition (as Flower's
own DP mods do), and logs it once.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import WARNING

from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

REFUSED = ErrorCode.MOD_FAILED_PRECONDITION  # the server records the reason of this code as it is


class Refusal(Exception):
    """The silo refuses the message: ``str(exc)`` is the one line the server records."""


def refusal_mod(
    message: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """Run the ClientApp; a :class:`Refusal` becomes the error reply ``(REFUSED, its line)``."""
    try:
        return call_next(message, context)
    except Refusal as exc:
        reason = " ".join(str(exc).split())  # one line, whatever the message held
        log(WARNING, "round %s %s: %s", message.metadata.group_id, message.metadata.message_type, reason)
        return Message(Error(code=REFUSED, reason=reason), reply_to=message)
