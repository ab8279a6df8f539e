"""Tasks of a message the SuperNode dropped are finished, so they cannot block the worker.

Flower 1.42's SuperNode (``start_client_internal._pull_and_store_message``) creates the
ClientApp task and stores the message *before* it pulls the message's objects from the
SuperLink. When that pull raises ``RunNotRunningException`` (the run was stopped or
failed meanwhile, e.g. the ServerApp of a run whose SuperLink was restarted sends one
more round) it logs "Ignoring message" and returns, leaving the task pending and the
message stored without its content. Stock Flower starts a ``flwr-clientapp`` for that
task which waits up to ``PULL_MAX_TIME`` (2 h) for objects that never come, beside the
processes of later tasks. The warm runtime serves one task at a time, so the same task
would hold its only worker for 2 h and every later message (a resumed run's) would go
unanswered.

:func:`install` wraps the function: when it returns without a run id after creating a
task, the task is finished (``FAILED``, which also revokes its token should the worker
have claimed it already) and the message and its objects are deleted, as Flower itself
does when the pull fails for any other reason.
"""

from __future__ import annotations

from typing import Any

DETAILS = "the run stopped before the message's objects were pulled; message dropped"


def install() -> None:
    """Patch this process's SuperNode loop (see the module docstring)."""
    import flwr.supernode.start_client_internal as sci

    sci._pull_and_store_message = finishing_dropped(sci._pull_and_store_message)


def finishing_dropped(pull: Any) -> Any:
    """``pull`` (called with Flower's keywords), finishing the task of a message it dropped."""
    from flwr.common.constant import SubStatus

    def pull_and_store(*args: Any, **kwargs: Any) -> int | None:
        state, object_store = kwargs["state"], kwargs["object_store"]
        tasks: list[int] = []
        messages: list[str] = []
        create_task, store_message = state.create_task, state.store_message

        def creating(*a: Any, **k: Any) -> int | None:
            task_id = create_task(*a, **k)
            if task_id is not None:
                tasks.append(task_id)
            return task_id

        def storing(message: Any) -> str | None:
            messages.append(message.metadata.message_id)
            return store_message(message)

        # Only this loop creates tasks and stores incoming messages, so shadowing the two
        # methods on the instance for the duration of one call sees exactly this message.
        state.create_task, state.store_message = creating, storing
        try:
            run_id = pull(*args, **kwargs)
        finally:
            del state.create_task, state.store_message
        if run_id is None and tasks:
            for task_id in tasks:  # False (nothing done) where Flower finished it already
                state.finish_task(task_id, sub_status=SubStatus.FAILED, details=DETAILS)
            state.delete_messages(message_ids=messages)
            for message_id in messages:
                object_store.delete(message_id)
        return run_id

    return pull_and_store
