"""Where studies that span machines keep their state: Optuna's storage (an SQLAlchemy database such as
PostgreSQL, or a journal file), the engine that hands work out to every host. The sweeps and the shared
frontier open it here.

    storage = open_rdb(url, heartbeat_s, lost=on_dead_trial, error=SweepError)
    lost_storage_in(error)    # the database error behind whatever Optuna raised, or None
"""

from __future__ import annotations

import inspect
import time
import warnings

from reservoir.platform.messages import first_line


def shown(url: str | None) -> str:
    """A storage URL as printed: its password masked (SQLAlchemy's own rendering), so a terminal line or a
    log never carries it; a value that is no database URL (a journal file) as given."""
    if not url:
        return "journal"
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads (or no SQLAlchemy): nothing to mask
        return url


def storage_errors() -> tuple[type[BaseException], ...]:
    """What a storage that went away raises: Optuna's wrapper and SQLAlchemy's own errors."""
    import optuna

    errors: tuple[type[BaseException], ...] = (optuna.exceptions.StorageInternalError,)
    try:
        from sqlalchemy.exc import SQLAlchemyError

        errors += (SQLAlchemyError,)
    except ImportError:  # a journal-file study has no database to lose
        pass
    return errors


def lost_storage_in(error: BaseException) -> BaseException | None:
    """The storage error behind ``error``, if any, the deepest one: Optuna can end a trial on a lost database
    with an error of its own raised while handling the storage's (its post-processing meets the same loss), and
    its wrapper's text blames "invalid data in the commit" where the database had stopped; the driver's error
    beneath it says what happened."""
    seen, found = set(), None
    while error is not None and id(error) not in seen:
        if isinstance(error, storage_errors()):
            found = error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return found


def _stale_callback_name() -> str:
    """Optuna 4.9 renamed the callback for trials whose worker died (4.0-4.8 know only the old name)."""
    import optuna

    parameters = inspect.signature(optuna.storages.RDBStorage).parameters
    return "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in parameters else \
        "failed_trial_callback"


def open_rdb(url: str, heartbeat_s: float, lost, error: type[Exception], what: str):
    """Optuna's RDB storage at ``url`` with heartbeats every ``heartbeat_s`` seconds: a trial whose process
    stopped beating for 4x that is failed, and ``lost(study, trial)`` is called for it (to run it again).
    A database that cannot be opened is one ``error`` naming ``what`` (the key that gave the URL)."""
    import optuna

    dead_worker = {_stale_callback_name(): lost}
    for attempt in range(5):
        try:
            with warnings.catch_warnings():  # heartbeats are marked experimental; they are what frees dead trials
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, heartbeat_interval=max(1, round(heartbeat_s)),
                                                  grace_period=max(2, round(4 * heartbeat_s)), **dead_worker)
        except Exception as e:  # noqa: BLE001 - SQLAlchemy, driver and OS errors alike: one line
            # hosts started together on an empty database race to create its tables: the loser retries
            if "already exists" in str(e) or "UniqueViolation" in str(e) or "duplicate key" in str(e):
                time.sleep(0.5 * (attempt + 1))
                continue
            raise error(f"cannot open the storage {shown(url)} ({first_line(e)}); check {what}") from None
    raise error(f"cannot create the storage's tables in {shown(url)}: other hosts keep racing; start again")
