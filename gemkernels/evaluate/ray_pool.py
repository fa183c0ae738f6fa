"""`RayPool`: the `Runner` of ``--ray [ADDRESS]``: runs as Ray tasks over a cluster, encoding in batched actors.

Each run is one task, at most twice the cluster's CPUs in flight (the object store holds a bounded share of a large
log set); results come back as they complete (`ray.wait`) and `runner.run_all` puts them in input order, so the
tables equal the local pool's. Encoding goes to `EncoderActor`s, each holding the encoders it was asked for
(`make_encoder` without its in-memory cache, built once per actor) and encoding one batch of texts per call: one
actor per GPU (``num_gpus=1``) on a cluster with GPUs, else one per `CPUS_PER_ENCODER` CPUs with as many threads
(reserving none: they share the CPUs with the tasks), spread over the nodes. The driver's embedding cache hands
every actor a batch of `BATCH` texts at once; a task's encoder sends its texts to the actors a batch at a time, in
turn.
"""

from __future__ import annotations

import itertools
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from gemkernels.compress.encoders import CachedEncoder, Encoder, make_encoder
from gemkernels.compress.encoders.cache import EmbeddingCache

#: Texts per actor call: `EmbeddingCache`'s default shard, so a call encodes the batch a local fill would.
BATCH = 128
#: On a cluster without GPUs, one encoder actor per this many CPUs (at least one).
CPUS_PER_ENCODER = 16


@ray.remote(max_restarts=3, max_task_retries=3)  # it holds nothing an encode cannot rebuild: a lost node restarts it
class EncoderActor:
    """Holds encoders by name, each built at its first use; encodes one batch of texts per call."""

    def __init__(self) -> None:
        self.encoders: dict[str, Encoder] = {}
        self.texts = 0

    def encoder(self, name: str) -> Encoder:
        if name not in self.encoders:
            self.encoders[name] = make_encoder(name, cached=False)
        return self.encoders[name]

    def describe(self, name: str) -> tuple[str, int]:
        """The encoder's ``name`` and ``dim`` (building it: a bad name or a missing extra fails here)."""
        encoder = self.encoder(name)
        return encoder.name, encoder.dim

    def encode(self, name: str, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return self.encoder(name).encode(texts)

    def encoded(self) -> int:
        """How many texts this actor has encoded."""
        return self.texts


class ActorEncoder:
    """The encoder ``name`` as ``actors`` hold it: texts in batches of ``batch``, each batch to the next actor in
    turn, all in flight together, rows in order. Its name and width are asked of an actor when it is built."""

    def __init__(self, name: str, actors: Sequence[Any], batch: int = BATCH):
        self.requested, self.actors, self.batch = name, tuple(actors), batch
        self.turn = os.getpid() % len(self.actors)  # the processes of a cluster start on different actors
        self.name, self.dim = ray.get(self.actors[self.turn].describe.remote(name))

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        batches = []
        for start in range(0, len(texts), self.batch):
            batches.append(self.actors[self.turn].encode.remote(self.requested, list(texts[start:start + self.batch])))
            self.turn = (self.turn + 1) % len(self.actors)
        return np.concatenate(ray.get(batches))


@dataclass(frozen=True)
class ActorEncoders:
    """`RayPool.encoder`: the encoder of a name on the pool's actors, in a `CachedEncoder` as `make_encoder`
    builds it. Travels with each task; copies are equal (by the pool's ``token``), so a process builds one."""

    token: str
    actors: tuple[Any, ...] = field(compare=False)
    batch: int = field(default=BATCH, compare=False)

    def __call__(self, name: str) -> Encoder:
        return CachedEncoder(ActorEncoder(name, self.actors, self.batch))


def encoder_placement(resources: Mapping[str, float], node_cpus: int) -> tuple[int, dict[str, Any]]:
    """How many encoder actors a cluster of ``resources`` (`ray.cluster_resources`) whose smallest node has
    ``node_cpus`` CPUs gets, and their Ray options: one per GPU; else one per `CPUS_PER_ENCODER` CPUs, each
    encoding with that many threads (at most a node's), since Ray gives an actor that reserves no CPU one thread."""
    gpus = int(resources.get("GPU", 0))
    if gpus:
        return gpus, {"num_gpus": 1, "num_cpus": 0, "scheduling_strategy": "SPREAD"}
    threads = max(1, min(CPUS_PER_ENCODER, node_cpus))
    return max(1, int(resources.get("CPU", 1)) // CPUS_PER_ENCODER), {
        "num_cpus": 0, "scheduling_strategy": "SPREAD", "runtime_env": {"env_vars": {"OMP_NUM_THREADS": str(threads)}}}


@ray.remote
def apply(function: Callable[[Any], Any], item: Any) -> Any:
    """One task: ``function(item)``."""
    return function(item)


class RayPool:
    """Runs on the Ray cluster at ``address`` (None: what ``ray.init()`` finds: ``$RAY_ADDRESS``, else a new local
    instance), from ``with`` on: a Ray session this process already has is used as it is and left open; the actors
    it started, and the session it opened, end at exit."""

    def __init__(self, address: str | None = None, batch: int = BATCH):
        self.address, self.batch = address, batch
        self.actors: tuple[Any, ...] = ()
        self.opened = False

    def __enter__(self) -> RayPool:
        if not ray.is_initialized():
            ray.init(address=self.address)
            self.opened = True
        self.resources = ray.cluster_resources()
        node_cpus = min((int(node["Resources"]["CPU"]) for node in ray.nodes()
                         if node["Alive"] and node["Resources"].get("CPU")), default=1)
        count, options = encoder_placement(self.resources, node_cpus)
        self.actors = tuple(EncoderActor.options(**options).remote() for _ in range(count))
        self.token = uuid.uuid4().hex
        self.in_flight = max(2, 2 * int(self.resources.get("CPU", 1)))
        return self

    def __exit__(self, error_type: type[BaseException] | None, *exc: object) -> None:
        try:
            if self.actors and error_type is None:
                print(self.summary(), file=sys.stderr)
            for actor in self.actors:
                ray.kill(actor)
        finally:
            self.actors = ()
            if self.opened:
                ray.shutdown()
                self.opened = False

    def summary(self) -> str:
        """One line: the encoder actors, the cluster's GPUs and CPUs, and how many texts the actors encoded."""
        texts = sum(ray.get([actor.encoded.remote() for actor in self.actors]))
        gpus, cpus = (int(self.resources.get(kind, 0)) for kind in ("GPU", "CPU"))
        return (f"ray: {len(self.actors)} encoder actor{'s' * (len(self.actors) != 1)} ({gpus} GPUs, {cpus} CPUs in "
                f"the cluster) encoded {texts:,} texts")

    @property
    def encoder(self) -> ActorEncoders:
        if not self.actors:
            raise RuntimeError("RayPool: use it inside `with`, where its actors live")
        return ActorEncoders(self.token, self.actors, self.batch)

    def completed(self, function: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        shipped = ray.put(function)
        queue = iter(enumerate(items))
        pending: dict[Any, int] = {}
        try:
            while True:
                for position, item in itertools.islice(queue, self.in_flight - len(pending)):
                    pending[apply.remote(shipped, item)] = position
                if not pending:
                    return
                ready, _ = ray.wait(list(pending), num_returns=1)
                yield pending.pop(ready[0]), ray.get(ready[0])
        finally:
            for ref in pending:
                ray.cancel(ref)

    def embedding_cache(self, name: str, folder: str | os.PathLike[str]) -> EmbeddingCache:
        return EmbeddingCache(self.encoder(name), folder, shard_size=self.batch * len(self.actors))
