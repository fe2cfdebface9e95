"""A pool of session servers as Ray actors, with sessions placed by consistent hashing of their id.

Owns starting N actors (scheduling strategy SPREAD, so they land on different nodes when there
are several), each running a session server over HTTP on its node; creating a session on the
actor its id hashes to; collecting merged samples (or every branch of a forked session,
`collect_branches`) concurrently from the actors that hold them
(each actor encodes its samples in the wire format, the pool decodes them zero-copy); deleting
sessions; shutdown; the args Miles' stock generate reads to reach the pool (`miles_args`: its
servers' IP, ports and instance ids; ports can be given, one per server, as Miles'
`--session-server-port` range names them). Session ids are unguessable (128 random bits drawn
here, no process tag) so the ring spreads them evenly; two pools never share a server, and a
server refuses an id already in use, so a collision (odds ~2^-128 per pair) would fail a create,
never merge two trajectories. An actor's merges (and their drift check) run on worker threads
(`SessionCore.merged`), so a collect does not stall the turns its uvicorn serves. It also owns
where this process connects to Ray when the pool is the first to need it (`ensure_ray`): never
from a thread that may exit, because Ray starts its head processes with a parent-death signal,
which Linux sends when the *thread* that started them exits. It does not own session logic
(`core.py`) or HTTP routes (`app.py`).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import os
import secrets
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from rl360_ext.errors import Rl360Error
from rl360_ext.session.samples import wire
from rl360_ext.session.samples.merge import MergedSample
from rl360_ext.session.service import SessionServerConfig
from rl360_ext.util.owner_thread import OwnerThread, on_lasting_thread

VNODES_PER_SERVER = 64


class SessionPoolError(Rl360Error, RuntimeError):
    """A pool operation failed for some sessions; the message names them and says why."""


_RAY_OWNER = OwnerThread("rl360-ray-owner")
_RAY_INIT_LOCK = threading.Lock()


def ensure_ray(**init_kwargs: Any) -> None:
    """Connect this process to Ray (`ray.init(**init_kwargs)`) unless it already is.

    On the main thread Ray is started right here; from any other thread it is started on one
    long-lived daemon thread (`rl360-ray-owner`), so Ray outlives the thread that asked for it."""
    import ray

    def init() -> None:
        with _RAY_INIT_LOCK:
            if not ray.is_initialized():
                ray.init(**init_kwargs)

    if not ray.is_initialized():
        on_lasting_thread(_RAY_OWNER, init)


def _point(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing of session ids onto `servers` slots, `vnodes` points per slot."""

    def __init__(self, servers: int, vnodes: int = VNODES_PER_SERVER) -> None:
        if servers < 1:
            raise ValueError(f"a pool needs at least one server, got {servers}")
        points = sorted((_point(f"server-{s}-vnode-{v}"), s) for s in range(servers) for v in range(vnodes))
        self._keys = [p for p, _ in points]
        self._servers = [s for _, s in points]

    def server_for(self, session_id: str) -> int:
        index = bisect.bisect(self._keys, _point(session_id)) % len(self._keys)
        return self._servers[index]


class SessionServerActor:
    """One session server inside a Ray actor: uvicorn on the actor's event loop, plus control calls."""

    def __init__(self, options: SessionServerConfig, host: str | None, port: int) -> None:
        self.options = options
        self.host = host
        self.port = port
        self.core: Any = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Serve HTTP on this node; returns the base URL."""
        import ray
        import uvicorn

        from rl360_ext.session.app import guarded_protocol
        from rl360_ext.session.service import app_for, build_core

        host = self.host or ray.util.get_node_ip_address()
        self.core = build_core(self.options)
        config = uvicorn.Config(
            app_for(self.core, self.options),
            host=host,
            port=self.port,
            http=guarded_protocol(),
            log_level="warning",
            access_log=False,
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"session server on {host}:{self.port} stopped while starting")
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://{host}:{port}"

    async def create_session(
        self,
        session_id: str,
        metadata: dict[str, Any] | None,
        routing_key: str | None,
        r3: bool | None = None,
    ) -> str:
        return self.core.create(metadata, routing_key, session_id=session_id, r3=r3).routing_key

    async def collect(self, session_ids: list[str]) -> list[bytes | str]:
        """Each session's merged sample in the wire format, or the error that stopped it."""

        async def one(sid: str) -> bytes | str:
            try:
                return await self.core.merged_wire(sid)
            except Exception as exc:  # reported per session; the pool raises with every reason
                return f"{type(exc).__name__}: {exc}"

        return list(await asyncio.gather(*(one(sid) for sid in session_ids)))

    async def collect_branches(self, session_ids: list[str]) -> list[list[bytes] | str]:
        """Each session's branch samples (`SessionCore.merge_branches`) in the wire format, or the error."""

        async def one(sid: str) -> list[bytes] | str:
            try:
                samples, _ = await self.core.merged_branches(sid)
            except Exception as exc:  # reported per session; the pool raises with every reason
                return f"{type(exc).__name__}: {exc}"
            return [wire.encode(sample) for sample in samples]

        return list(await asyncio.gather(*(one(sid) for sid in session_ids)))

    async def delete(self, session_ids: list[str]) -> list[str]:
        missing = []
        for sid in session_ids:
            try:
                self.core.delete(sid)
            except Exception as exc:  # an unknown id is reported, the rest are deleted
                missing.append(f"{sid}: {exc}")
        return missing

    async def pid(self) -> int:
        """This actor's process id (its CPU and memory, for a profiler or a benchmark)."""
        return os.getpid()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await self._task


class SessionPool:
    """N session servers as Ray actors. Sync methods block; `a*` methods are awaitable."""

    def __init__(
        self,
        num_servers: int = 1,
        backend_url: str = "",
        tokenizer_dir: str = "",
        r3: bool = False,
        *,
        host: str | None = None,
        port: int = 0,
        ports: Sequence[int] | None = None,
        actor_num_cpus: float = 1.0,
        **options: Any,
    ) -> None:
        import ray

        if not backend_url or not tokenizer_dir:
            raise ValueError("SessionPool needs backend_url and tokenizer_dir")
        if ports is not None and len(ports) != num_servers:
            raise ValueError(f"ports names {len(ports)} ports for {num_servers} servers (one per server)")
        ensure_ray()
        self.options = SessionServerConfig(
            backend_url=backend_url, tokenizer_dir=str(tokenizer_dir), r3=r3, **options
        )
        self.ring = HashRing(num_servers)
        actor_class = ray.remote(SessionServerActor)
        self.instance_ids = [secrets.token_hex(16) for _ in range(num_servers)]
        self.actors = [
            actor_class.options(scheduling_strategy="SPREAD", num_cpus=actor_num_cpus).remote(
                replace(self.options, instance_id=instance_id), host, port if ports is None else ports[i]
            )
            for i, instance_id in enumerate(self.instance_ids)
        ]
        self.urls: list[str] = ray.get([actor.start.remote() for actor in self.actors])

    def miles_args(self) -> dict[str, Any]:
        """The driver-side args Miles' stock `agentic_tool_call.generate` reads to reach this pool.

        `session_server_ip`, `session_server_ports` and `session_server_instance_ids`, as Miles'
        launcher sets them for its own servers (or, with patches/miles/0004's
        `--session-server-external`, from `--session-server-ip`/`--session-server-port`). Miles
        addresses its session servers as one IP and a list of ports, so the pool's servers must
        share a host (pass `host=`); raises ValueError naming the hosts otherwise.
        """
        hosts = sorted({url.removeprefix("http://").rsplit(":", 1)[0] for url in self.urls})
        if len(hosts) != 1:
            raise ValueError(f"Miles reaches session servers on one IP; this pool's are on {hosts}")
        ports = [int(url.rsplit(":", 1)[1]) for url in self.urls]
        return {
            "session_server_ip": hosts[0],
            "session_server_ports": ports,
            "session_server_instance_ids": dict(zip(ports, self.instance_ids, strict=True)),
        }

    def server_for(self, session_id: str) -> int:
        return self.ring.server_for(session_id)

    def _base_url(self, session_id: str) -> str:
        return f"{self.urls[self.server_for(session_id)]}/sessions/{session_id}/v1"

    async def acreate_session(
        self, metadata: dict[str, Any] | None = None, routing_key: str | None = None, r3: bool | None = None
    ) -> tuple[str, str]:
        """(session_id, base_url): point an OpenAI client at base_url. `r3=False` opts this
        session out of the pool's routing replay (`SessionCore.create`)."""
        session_id = secrets.token_hex(16)
        actor = self.actors[self.server_for(session_id)]
        await actor.create_session.remote(session_id, metadata, routing_key, r3)
        return session_id, self._base_url(session_id)

    def create_session(
        self, metadata: dict[str, Any] | None = None, routing_key: str | None = None
    ) -> tuple[str, str]:
        import ray

        session_id = secrets.token_hex(16)
        actor = self.actors[self.server_for(session_id)]
        ray.get(actor.create_session.remote(session_id, metadata, routing_key))
        return session_id, self._base_url(session_id)

    def _by_server(self, session_ids: Iterable[str]) -> dict[int, list[str]]:
        groups: dict[int, list[str]] = {}
        for sid in session_ids:
            groups.setdefault(self.server_for(sid), []).append(sid)
        return groups

    @staticmethod
    def _decode(
        session_ids: Sequence[str], groups: dict[int, list[str]], results: list[list[Any]]
    ) -> list[MergedSample]:
        found: dict[str, MergedSample] = {}
        errors: list[str] = []
        for group, encoded in zip(groups.values(), results, strict=True):
            for sid, item in zip(group, encoded, strict=True):
                if isinstance(item, str):
                    errors.append(f"{sid}: {item}")
                else:
                    found[sid] = wire.decode(item)
        if errors:
            raise SessionPoolError(f"could not collect {len(errors)} session(s): " + "; ".join(errors))
        return [found[sid] for sid in session_ids]

    def collect(self, session_ids: Sequence[str]) -> list[MergedSample]:
        """Merged samples in the order of `session_ids`, fetched from all servers at once."""
        import ray

        groups = self._by_server(session_ids)
        refs = [self.actors[server].collect.remote(ids) for server, ids in groups.items()]
        return self._decode(session_ids, groups, ray.get(refs))

    async def acollect(self, session_ids: Sequence[str]) -> list[MergedSample]:
        groups = self._by_server(session_ids)
        refs = [self.actors[server].collect.remote(ids) for server, ids in groups.items()]
        return self._decode(session_ids, groups, list(await asyncio.gather(*refs)))

    def collect_branches(self, session_ids: Sequence[str]) -> list[list[MergedSample]]:
        """Every branch a trainer can use (`merge.branches`: one sample per history segment, a
        retried last turn dropped), per session in the order of `session_ids`."""
        import ray

        groups = self._by_server(session_ids)
        refs = [self.actors[server].collect_branches.remote(ids) for server, ids in groups.items()]
        found: dict[str, list[MergedSample]] = {}
        errors: list[str] = []
        for group, encoded in zip(groups.values(), ray.get(refs), strict=True):
            for sid, item in zip(group, encoded, strict=True):
                if isinstance(item, str):
                    errors.append(f"{sid}: {item}")
                else:
                    found[sid] = [wire.decode(one) for one in item]
        if errors:
            raise SessionPoolError(f"could not collect {len(errors)} session(s): " + "; ".join(errors))
        return [found[sid] for sid in session_ids]

    def delete(self, session_ids: str | Sequence[str]) -> None:
        import ray

        ids = [session_ids] if isinstance(session_ids, str) else list(session_ids)
        groups = self._by_server(ids)
        missing = [
            m for ms in ray.get([self.actors[s].delete.remote(g) for s, g in groups.items()]) for m in ms
        ]
        if missing:
            raise SessionPoolError("could not delete: " + "; ".join(missing))

    async def adelete(self, session_ids: str | Sequence[str]) -> None:
        ids = [session_ids] if isinstance(session_ids, str) else list(session_ids)
        groups = self._by_server(ids)
        results = await asyncio.gather(*(self.actors[s].delete.remote(g) for s, g in groups.items()))
        missing = [m for ms in results for m in ms]
        if missing:
            raise SessionPoolError("could not delete: " + "; ".join(missing))

    def shutdown(self) -> None:
        """Stop every server and release the actors."""
        import ray

        ray.get([actor.stop.remote() for actor in self.actors])
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
