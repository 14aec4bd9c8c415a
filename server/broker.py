"""Past one process (ANDREA_BROKER_URL=redis://...): Redis carries what one server process
knows to the others, so several `andrea serve` processes (or `uvicorn --workers N`) over one
PostgreSQL store serve one set of runs.

- Live messages: every process publishes what it fans out on one pub/sub channel and delivers
  what the others publish to its own viewers. Pub/sub keeps one publisher's order, and records
  are published after their commit, so the argument in telemetry/viewer.py (subscribe, then read
  the store once more: nothing falls between) holds across processes. A message lost while Redis
  was away is healed by the store: after a reconnect every viewer re-reads it from its cursor.
- Trainer presence: the key andrea:trainer:<run> names the process holding the run's trainer
  socket; it expires PRESENCE_TTL_S after that process stops refreshing it (killed), so a
  trainer can reconnect to another process within seconds.
- Run locks: a Redis lock per run orders hellos, resumes, deletes and checkpoint commits
  across processes (fanout.Fanout.run_lock takes it inside the in-process lock).

Without a broker none of this exists: one process, in memory (fanout.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Iterable

import redis.asyncio as redis
from redis.exceptions import RedisError

from andrea.errors import UNAVAILABLE, UNAVAILABLE_RETRY_S, Refused

log = logging.getLogger("andrea.broker")

CHANNEL = "andrea:live"
TRAINER_KEY = "andrea:trainer:"      # + run id -> the origin of the process holding it
LOCK_KEY = "andrea:lock:"            # + run id
PRESENCE_TTL_S = 6                   # a killed process's trainers are gone after this
REFRESH_S = 2.0                      # presence keys refreshed (and others' read) this often
OUTBOX = 10_000                      # messages waiting for Redis; past it the oldest go
LOCK_TIMEOUT_S = 60                  # a lock outlives a crashed holder by at most this
LOCK_WAIT_S = 30

# Deletes the presence key only if this process still holds it (a reconnect elsewhere may
# have claimed the run since).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


class BrokerUnavailable(Refused):
    """Redis cannot be reached: the reason, with its URL (UNAVAILABLE: API 503, sockets 1013)."""

    def __init__(self, message: str):
        super().__init__(UNAVAILABLE, message, UNAVAILABLE_RETRY_S)


class RedisBroker:
    def __init__(self, url: str):
        self.url = url
        self.origin = secrets.token_hex(8)           # this process, in envelopes and keys
        self.redis = redis.from_url(url, socket_connect_timeout=5, health_check_interval=10)
        self.remote_trainers: frozenset[str] = frozenset()   # runs trained on other processes
        self.dropped = 0                             # messages the outbox had to let go
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._release = self.redis.register_script(_RELEASE)

    async def start(self, deliver: Callable[[str, str], None], resync: Callable[[], None],
                    local_trainers: Callable[[], Iterable[str]]) -> None:
        """Subscribes before returning (the server serves only once it hears the others),
        then keeps delivering others' messages, publishing ours and refreshing presence."""
        pubsub = await self._subscribe()
        self._tasks = [asyncio.create_task(self._read(pubsub, deliver, resync)),
                       asyncio.create_task(self._publish_loop()),
                       asyncio.create_task(self._presence(local_trainers))]

    async def _subscribe(self):
        try:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(CHANNEL)
            return pubsub
        except (RedisError, OSError) as e:
            raise BrokerUnavailable(f"cannot reach the broker {self.url}: {e}") from e

    def publish(self, run_id: str, text: str) -> None:
        """Queued for every other process; never blocks the event loop."""
        if self._outbox.qsize() >= OUTBOX:
            self._outbox.get_nowait()               # the store heals it (resync)
            self.dropped += 1
        self._outbox.put_nowait(f"{self.origin}\n{run_id}\n{text}".encode())

    async def _publish_loop(self) -> None:
        while True:
            envelope = await self._outbox.get()
            while True:
                try:
                    await self.redis.publish(CHANNEL, envelope)
                    break
                except (RedisError, OSError) as e:
                    log.warning("broker %s: publish failed (%s); retrying", self.url, e)
                    await asyncio.sleep(1.0)

    async def _read(self, pubsub, deliver, resync) -> None:
        while True:
            try:
                async for message in pubsub.listen():
                    if message["type"] != "message":
                        continue
                    origin, run_id, text = message["data"].decode().split("\n", 2)
                    if origin != self.origin:
                        deliver(run_id, text)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as e:
                log.warning("broker %s: subscription lost (%s); reconnecting", self.url, e)
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            while True:
                await asyncio.sleep(1.0)
                try:
                    pubsub = await self._subscribe()
                    break
                except BrokerUnavailable:
                    continue
            resync()        # whatever was published meanwhile is in the store

    async def _presence(self, local_trainers: Callable[[], Iterable[str]]) -> None:
        while True:
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for run_id in local_trainers():
                        pipe.set(TRAINER_KEY + run_id, self.origin, ex=PRESENCE_TTL_S)
                    await pipe.execute()
                remote = set()
                async for key in self.redis.scan_iter(match=TRAINER_KEY + "*", count=1000):
                    remote.add(key.decode()[len(TRAINER_KEY):])
                self.remote_trainers = frozenset(remote - set(local_trainers()))
            except (RedisError, OSError) as e:
                log.warning("broker %s: presence refresh failed (%s)", self.url, e)
            await asyncio.sleep(REFRESH_S)

    async def claim_trainer(self, run_id: str) -> bool:
        """This process takes the run's trainer slot; False when another process holds it."""
        try:
            if await self.redis.set(TRAINER_KEY + run_id, self.origin, nx=True,
                                    ex=PRESENCE_TTL_S):
                return True
            return (await self.redis.get(TRAINER_KEY + run_id) or b"").decode() == self.origin
        except (RedisError, OSError) as e:
            raise BrokerUnavailable(f"cannot reach the broker {self.url}: {e}") from e

    async def release_trainer(self, run_id: str) -> None:
        with contextlib.suppress(RedisError, OSError):   # it expires by itself
            await self._release(keys=[TRAINER_KEY + run_id], args=[self.origin])

    async def trainer_elsewhere(self, run_id: str) -> bool:
        try:
            holder = await self.redis.get(TRAINER_KEY + run_id)
        except (RedisError, OSError) as e:
            raise BrokerUnavailable(f"cannot reach the broker {self.url}: {e}") from e
        return holder is not None and holder.decode() != self.origin

    @contextlib.asynccontextmanager
    async def lock(self, run_id: str):
        lock = self.redis.lock(LOCK_KEY + run_id, timeout=LOCK_TIMEOUT_S,
                               blocking_timeout=LOCK_WAIT_S)
        try:
            got = await lock.acquire()
        except (RedisError, OSError) as e:
            raise BrokerUnavailable(f"cannot reach the broker {self.url}: {e}") from e
        if not got:
            raise BrokerUnavailable(f"run {run_id}: its lock stayed taken for {LOCK_WAIT_S} s")
        try:
            yield
        finally:
            with contextlib.suppress(RedisError, OSError):
                await lock.release()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.redis.aclose()
