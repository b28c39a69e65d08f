"""Talking to the broker from the producer side: fail fast, publish slices, broker epoch."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from celery import Celery
from kombu.exceptions import OperationalError as KombuOperationalError

from examforge.errors import BrokerUnavailable, ConfigError
from examforge.settings import Settings, is_sentinel_url

if TYPE_CHECKING:
    from storage import Store

EPOCH_KEY = "examforge:broker-epoch"
PUBLISH_BATCH = 1000  # messages per Redis pipeline when publishing many chapters
CHAPTER_TASK = "examforge.generate_chapter"


TASK_ID_PREFIX = "examforge:"
# examforge:SLUG:CHAPTER:SLICE; before slices, examforge:SLUG:CHAPTER (slice 0).
_TASK_ID_RE = re.compile(r"^examforge:([a-z0-9-]+):([a-z0-9-]+)(?::([0-9]+))?$")


def task_id(exam: str, chapter_id: str, slice_no: int = 0) -> str:
    """The deterministic task id of a slice (slug and chapter id are both [a-z0-9-])."""
    return f"{TASK_ID_PREFIX}{exam}:{chapter_id}:{slice_no}"


def parse_task_id(value: str) -> tuple[str, str, int] | None:
    """(exam, chapter id, slice) of a slice's task id, None for anything else."""
    match = _TASK_ID_RE.match(value)
    if not match:
        return None
    return match.group(1), match.group(2), int(match.group(3) or 0)


# What the broker holds for one queue, in one round trip: the length of its list (messages
# waiting), and the task ids of its messages that workers took and have not acked yet. kombu
# keeps every unacked message, whatever its queue, in one hash as JSON [message, exchange,
# routing key], keyed by delivery tag, and the time of each delivery in a sorted set (the
# index it restores from after the visibility timeout); the hash is scanned inside Redis so
# that only the ids cross the network. The id is read as the first "examforge:..." in the
# message: its headers carry it (and root_id, the same for our tasks) while the body is
# base64. A message delivered before ARGV[3] (a Unix time) is returned apart, as stale: a
# worker that has held it that long without starting its chapter is taken as gone with it
# (SIGKILLed between receiving the message and claiming the slice), and the reconciler
# publishes the slice again rather than wait for the visibility timeout (hours).
_HOLDINGS_LUA = """
local queued = redis.call('LLEN', KEYS[1])
local suffix = ARGV[1]
local n = #suffix
local cutoff = tonumber(ARGV[3])
local ids = {}
local stale = {}
local cursor = '0'
repeat
  local page = redis.call('HSCAN', KEYS[2], cursor, 'COUNT', 1000)
  cursor = page[1]
  local entries = page[2]
  for i = 2, #entries, 2 do
    local entry = entries[i]
    if string.sub(entry, -n) == suffix then
      local id = string.match(entry, ARGV[2])
      if id then
        local at = tonumber(redis.call('ZSCORE', KEYS[3], entries[i - 1]))
        if at == nil or at >= cutoff then
          ids[#ids + 1] = id
        else
          stale[#stale + 1] = id
        end
      end
    end
  end
until cursor == '0'
return {queued, ids, stale}
"""


@dataclass(frozen=True)
class QueueHoldings:
    queued: int  # messages in the queue's list
    unacked: list[tuple[str, str, int]]  # (exam, chapter, slice) of messages delivered, not acked
    # ... of those delivered before the cutoff (`queue_holdings`): their workers are taken as
    # gone, and a slice of them still waiting is lost for certain.
    stale: list[tuple[str, str, int]] = field(default_factory=list)


def is_redis(settings: Settings) -> bool:
    """A Redis broker, reached directly or through Sentinel."""
    return settings.broker_url.startswith(("redis://", "rediss://", "unix://", "sentinel://"))


SENTINEL_PORT = 26379  # kombu's and redis-py's default for a Sentinel without a port


def sentinel_addresses(url: str) -> list[tuple[str, int]]:
    """(host, port) of each Sentinel a sentinel:// BROKER_URL lists, `;` between them."""
    from kombu.utils.url import url_to_parts

    parts = [url_to_parts(one) for one in url.split(";") if one.strip()]
    return [(p.hostname or "localhost", p.port or SENTINEL_PORT) for p in parts]


def broker_redis(settings: Settings) -> Any:
    """A redis-py client on the broker's Redis, for what lives there beside the queues (the
    shared rate limiter, the provider's holds). Through Sentinel it is redis-py's own
    `Sentinel(...).master_for`: each new connection asks the Sentinels where the master is,
    so the client follows a failover (and drops a connection to a master demoted to a
    replica, on its first READONLY reply)."""
    import redis

    options: dict[str, Any] = {"socket_timeout": 2, "socket_connect_timeout": 2,
                               "health_check_interval": 10}
    if not is_sentinel_url(settings.broker_url):
        return redis.Redis.from_url(settings.broker_url, **options)
    from kombu.utils.url import url_to_parts
    from redis.sentinel import Sentinel

    from tasks.config import sentinel_kwargs

    # The master's password and database are the first URL's, as kombu reads them.
    first = url_to_parts(settings.broker_url.split(";", 1)[0])
    sentinel = Sentinel(sentinel_addresses(settings.broker_url),
                        sentinel_kwargs=sentinel_kwargs(settings), **options)
    return sentinel.master_for(settings.broker_sentinel_master or "",
                               username=first.username, password=first.password,
                               db=int(first.path or 0))


def queue_holdings(app: Celery, settings: Settings) -> QueueHoldings | None:
    """What the broker holds for the chapter queue; None for brokers other than Redis."""
    if not is_redis(settings):
        return None
    from kombu.transport.redis import Channel

    queue = settings.task_queue
    # Held past a lease without its slice picked: its worker is gone (_HOLDINGS_LUA). A live
    # worker picks a message as it starts it; one it reserved behind running tasks (a
    # prefetch multiplier above 1) may wait longer, and gets a second message: a no-op.
    cutoff = time.time() - max(settings.lease_s, 2 * settings.reconcile_interval_s)
    try:
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            queued, ids, stale = client.eval(_HOLDINGS_LUA, 3, queue, Channel.unacked_key,
                                             Channel.unacked_index_key, f'"{queue}"]',
                                             "examforge:[%w%-:]+", repr(cutoff))
    except Exception as exc:
        raise BrokerUnavailable(f"broker queue unreadable: {exc}".splitlines()[0]) from None

    def parsed(raws: list[Any]) -> list[tuple[str, str, int]]:
        return [pair for raw in raws if (pair := parse_task_id(
            raw.decode() if isinstance(raw, bytes) else raw))]
    return QueueHoldings(int(queued), parsed(ids), parsed(stale))


def _redacted(url: str) -> str:
    from kombu.utils.url import maybe_sanitize_url

    # Each of a sentinel:// URL's parts: kombu's hides the first password only.
    return ";".join(maybe_sanitize_url(one) for one in url.split(";"))


def check_broker(app: Celery, settings: Settings) -> None:
    """Raise BrokerUnavailable within about `broker_connect_timeout_s` when it is down.

    Celery would otherwise retry the connection for a long time; a CLI must answer at once.
    """
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                   timeout=settings.broker_connect_timeout_s)
    except (KeyError, ValueError) as exc:
        # A URL kombu or redis-py cannot use (an unknown transport, a database that is not a
        # number): no retry fixes it. Their messages do not repeat the URL's password.
        reason = exc.args[0] if exc.args else exc
        raise ConfigError(f"BROKER_URL: {reason}".splitlines()[0]) from None
    except Exception as exc:  # kombu raises many other types here, all meaning "not reachable"
        # redis-py's "No master found" repeats every Sentinel's client at length: ask them
        # what they know instead, in one line.
        why = sentinel_verdict(settings) if is_sentinel_url(settings.broker_url) else None
        raise BrokerUnavailable(
            f"broker {_redacted(settings.broker_url)} unreachable: {why or exc}".splitlines()[0]
        ) from None


def sentinel_report(settings: Settings) -> list[tuple[str, str | None, str]]:
    """What each Sentinel of BROKER_URL says of BROKER_SENTINEL_MASTER: (its address, the
    master's address or None, what it said), in the URL's order."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from tasks.config import sentinel_kwargs

    name = settings.broker_sentinel_master or ""
    found: list[tuple[str, str | None, str]] = []
    for host, port in sentinel_addresses(settings.broker_url):
        where = f"{host}:{port}"
        # Asked once each: redis-py's default retries with backoff take seconds a Sentinel.
        client = redis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0),
                             **sentinel_kwargs(settings))
        try:
            state: dict[str, Any] = client.sentinel_master(name)  # type: ignore[assignment]
        except redis.ResponseError as exc:  # "No such master with that name"
            found.append((where, None, f"knows no master named {name!r} "
                                       f"(BROKER_SENTINEL_MASTER): {exc}"))
            continue
        except redis.RedisError as exc:
            found.append((where, None, f"unreachable: {str(exc).splitlines()[0]}"))
            continue
        finally:
            client.close()
        master = f"{state['ip']}:{state['port']}"
        flags = str(state.get("flags", ""))
        if "s_down" in flags or "o_down" in flags:
            found.append((where, None, f"sees master {name!r} at {master} down ({flags})"))
        else:
            found.append((where, master, f"master {name!r} at {master}, "
                                         f"{state.get('num-slaves', 0)} replicas, "
                                         f"{state.get('num-other-sentinels', 0)} other Sentinels"))
    return found


def sentinel_verdict(settings: Settings) -> str | None:
    """Why no master could be had through the Sentinels, in one line (None: they name one)."""
    report = sentinel_report(settings)
    if any(master for _, master, _ in report):
        return None
    return "; ".join(f"Sentinel {where} {said}" for where, _, said in report)


def broker_epoch(app: Celery, settings: Settings) -> str | None:
    """An id that lives in the broker itself: when Redis loses its data (restart without
    persistence, FLUSHALL) the id changes, and the reconciler knows every queued message of the
    old epoch is gone. None for brokers other than Redis."""
    if not is_redis(settings):
        return None
    try:
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            client.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
            value = client.get(EPOCH_KEY)
    except Exception as exc:
        raise BrokerUnavailable(f"broker epoch unreadable: {exc}".splitlines()[0]) from None
    return value.decode() if isinstance(value, bytes) else value


# Message headers naming the database the message was published from (storage.identity).
DATABASE_ID_HEADER = "examforge_database_id"
DATABASE_HEADER = "examforge_database"


def origin_headers(store: Store) -> dict[str, str]:
    """What every slice message carries: its database's id, and where that database is (for
    the warning of a worker that reads another one)."""
    return {DATABASE_ID_HEADER: store.database_id(), DATABASE_HEADER: store.database_label()}


BATCH_TASK = "examforge.batches"


def publish_batch_pass(app: Celery, origin: dict[str, str] | None = None) -> None:
    """One batch pass (runner.batching) now, instead of waiting for beat's next one: what
    `enqueue --batch` (and resume, retry) publish for a batch-mode exam."""
    try:
        app.send_task(BATCH_TASK, (), headers=origin)
    except (KombuOperationalError, OSError) as exc:
        raise BrokerUnavailable(f"publishing to the broker failed: {exc}".splitlines()[0]) from None


def publish_work(app: Celery, store: Store, exam: str, slices: Sequence[tuple[str, int]],
                 epoch: str | None) -> None:
    """Hand an exam's slices on: one chapter task each (marked enqueued first), or for a
    batch-mode exam one batch pass, which submits them in a provider batch."""
    from storage.models import ExamMode

    if not slices:
        return
    if store.exam_mode(exam) is ExamMode.batch:
        publish_batch_pass(app, origin_headers(store))
        return
    store.mark_enqueued(exam, slices, epoch)
    publish_slices(app, exam, slices, origin_headers(store))


def publish_slices(app: Celery, exam: str, slices: Sequence[tuple[str, int]],
                   origin: dict[str, str] | None = None) -> None:
    """One message per slice, with its deterministic task id and `origin` (origin_headers)
    in its headers, pipelined: kombu's
    `Producer.batch()` buffers the publishes of one connection in a Redis pipeline, a round
    trip per thousand messages instead of one per message. A batch that fails part-way leaves
    some slices marked enqueued without a message: the reconciler finds and re-publishes
    those (Store.lost_messages)."""
    try:
        with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
            for chapter_id, slice_no in slices:
                app.send_task(CHAPTER_TASK, (exam, chapter_id, slice_no),
                              task_id=task_id(exam, chapter_id, slice_no), producer=producer,
                              headers=origin)
    except (KombuOperationalError, OSError) as exc:
        raise BrokerUnavailable(f"publishing to the broker failed: {exc}".splitlines()[0]) from None
