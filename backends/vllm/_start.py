"""Starting and stopping an `AsyncLLM`, shared by the generating engine and the embedder.

    start_llm(load)          off-line environment, vLLM imported and `load` run off the event
                             loop, then vLLM's output handler started on this loop
    opened(source)           a ModelSource's directory for the length of a load, then released
    engine_arguments(…)      the engine arguments both engines share (pure: no vLLM)
    build_llm(directory, …)  the `AsyncLLM` on them
    stop_llm(llm)            shutdown that returns once the engine's processes are gone

Nothing here imports vLLM at module level.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..types import ModelSource
from ._load import SchedulerSnapshot, stat_logger_factory
from ._options import VllmOptions
from ._processes import EngineProcesses

__all__ = ["abort_request", "build_llm", "engine_arguments", "opened", "start_llm", "stop_llm"]

_log = logging.getLogger("airgate.vllm")

# Air-gap defaults, set before vLLM (and through it huggingface_hub) is imported; the engine-core
# process inherits them.  An operator's explicit value wins.
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

# Imported once, off the event loop, before anything else of vLLM (see `_import_vllm`).
_HEAVY_MODULES = (
    "tokenizers",
    "transformers",
    "vllm.engine.arg_utils",
    "vllm.exceptions",
    "vllm.inputs",
    "vllm.pooling_params",
    "vllm.sampling_params",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.exceptions",
    "vllm.v1.metrics.loggers",
)


async def start_llm(load: Callable[[], Any]) -> Any:
    """Run `load` (blocking: it builds the `AsyncLLM`, and reads whatever else it needs from
    the model directory) in a thread, then start vLLM's output handler on this loop; returns
    the `AsyncLLM` that `load` returned."""
    for key, value in _OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    await asyncio.to_thread(_import_vllm)
    # The engine-core handshake blocks until the model is loaded: off the event loop.
    llm = await asyncio.to_thread(load)
    # The output handler must be a task on this loop; AsyncLLM starts it lazily on the first
    # request otherwise, and an engine-core failure before then would go unnoticed.
    llm._run_output_handler()
    return llm


@contextlib.contextmanager
def opened(source: str | ModelSource) -> Iterator[str]:
    """The model directory while the block runs; a ModelSource is released after it, whether
    loading worked or not.

    A decrypted bundle's directory is a path on this node's tmpfs, private to this user: every
    vLLM process here reads it (the engine core, and with tensor or pipeline parallelism its
    "mp" worker processes), and all of them have loaded their weights by the time `build_llm`
    returns.  Ray workers on other nodes could not read it: the gateway refuses "ray" for
    bundles.
    """
    if isinstance(source, str):
        yield source
        return
    directory = source.open()
    try:
        yield directory
    finally:
        source.release()


def engine_arguments(directory: str, options: VllmOptions) -> dict[str, Any]:
    """The `AsyncEngineArgs` keyword arguments both engines share, for the model in
    `directory` (vLLM's own defaults for anything not named here)."""
    opts = options
    return {
        "model": directory,
        "tokenizer": directory,
        "dtype": opts.dtype,
        "seed": opts.seed,
        "tensor_parallel_size": opts.tensor_parallel_size,
        "pipeline_parallel_size": opts.pipeline_parallel_size,
        "distributed_executor_backend": opts.distributed_executor_backend,
        "gpu_memory_utilization": opts.gpu_memory_utilization,
        "max_num_seqs": opts.max_num_seqs,
        "enforce_eager": opts.enforce_eager,
        "enable_prefix_caching": opts.enable_prefix_caching,
        "scheduling_policy": "priority",
        "trust_remote_code": False,
        "enable_log_requests": False,  # no request ids, parameters or prompts in the log
        "disable_log_stats": True,  # no periodic log lines; our stat logger still gets stats
        "kv_cache_memory_bytes": (
            int(opts.kv_cache_space_gib * 2**30) if opts.kv_cache_space_gib else None
        ),
    }


def build_llm(
    directory: str, options: VllmOptions, snapshot: SchedulerSnapshot, **engine_args: Any
) -> Any:
    """Blocking: an `AsyncLLM` on `directory` (engine core started, model loaded), reporting
    its scheduler statistics into `snapshot`.  `engine_args` add to (or replace) the shared
    arguments."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    opts = options
    args = AsyncEngineArgs(**(engine_arguments(directory, opts) | engine_args))
    if opts.max_model_len:
        args.max_model_len = opts.max_model_len
    return AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(snapshot)])


async def stop_llm(llm: Any) -> None:
    """Shut `llm` down; the engine-core process (and its workers) are gone after."""
    # The output handler goes first: the engine core's exit is expected from here on, not an
    # error for vLLM to log.
    handler = llm.output_handler
    if handler is not None:
        handler.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await handler
    processes = EngineProcesses(llm)
    await asyncio.to_thread(llm.shutdown)
    await asyncio.to_thread(processes.wait)
    await asyncio.sleep(0)  # vLLM closes its sockets through call_soon_threadsafe


async def abort_request(llm: Any, request_id: str) -> None:
    """Abort one request by vLLM's internal id (its external id + suffix), so that requests
    sharing a gateway request id are not aborted together; a parent id (n > 1) aborts every
    choice."""
    try:
        await llm.abort(request_id, internal=True)
    except Exception:  # the engine is gone; nothing is left to abort
        _log.debug("abort after the engine stopped", exc_info=True)


def _import_vllm() -> None:
    """Import vLLM (and transformers, tokenizers) from a frame that holds nothing.

    Some of their modules keep an import error, traceback and all (`vllm.multimodal.media.audio`
    keeps the `torchcodec` one): every frame of the first import stays alive with its locals.
    Importing here keeps those frames free of the engine, which would otherwise never be freed.
    """
    for module in _HEAVY_MODULES:
        importlib.import_module(module)
