"""The thin DDP training loop over a plan: how any trainer consumes ``plan/``; checkpoints.

Each rank reads only its shard (:mod:`dataprep.training.loader`) and runs one optimizer step
per plan step; every rank has the same steps. Backend: gloo on CPU, nccl on GPU. ``dataprep
train --nproc N`` spawns N local processes; under ``torchrun`` each process is one rank; the
process count must equal the plan's world size. Rank 0 prints a JSON line a step.
``<dir>/last.pt`` (:mod:`dataprep.training.checkpoint`) holds ``next_step``, ``model``,
``optimizer`` (AdamW), ``plan_hash``, ``config``, ``content_sha256``; ``--resume`` continues at
exactly that step, also on a plan re-planned there. Dropout is seeded per (seed, step, rank). A
folder holding a run is refused without ``--resume`` or ``--overwrite``. Beside ``last.pt``:
``log.jsonl``, ``skipped-rank-0000r.jsonl`` (``--skip-bad-audio``), ``trace-rank-0000r.jsonl``
(``--trace``), ``steps-rank-0000r.parquet`` (seconds of each step's data wait, own forward +
backward, all-reduce wait and optimizer step: what ``dataprep calibrate`` fits; :class:`GradSyncClock`).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bucketing.dynres import DynResConfig
from dataprep.planning.step_reads import PrefetchOptions
from dataprep.training.batches import Batch, BatchBuilder
from dataprep.training.checkpoint import load_checkpoint, save_checkpoint
from dataprep.training.features import FeatureConfig
from dataprep.training.loader import PlanDataset, make_loader
from dataprep.training.packed import PackedBatch, PackedBatchBuilder, collate_packed
from dataprep.training_config import TrainConfig
from manifests.errors import DataprepError, OptionError
from dataprep.tokenize import require_recorded_tokenizer
from manifests.atomic_files import atomic_path
from manifests.hash_cache import require_manifest_hash
from manifests.options import check_int
from manifests.outputs import require_free_checkpoint_dir
from manifests.plan_cursor import argument_validator, resume_point
from manifests.plan_meta import PlanMeta, read_plan_meta
from oom.packed_estimate import SPEECH_LLMS
from oom.speech_llm import SpeechLLM, packed_loss


#: a rank's step log (``steps-rank-0000r.parquet``): the seconds of each of its steps
STEP_TIMES_SCHEMA = pa.schema([("rank", pa.int32()), ("step", pa.int64()), ("data_wait_s", pa.float64()),
                               ("forward_backward_s", pa.float64()), ("optimizer_s", pa.float64()),
                               ("grad_sync_s", pa.float64())])
#: a step log written before ``grad_sync_s`` (read as null there)
_STEP_TIMES_V1 = pa.schema([f for f in STEP_TIMES_SCHEMA if f.name != "grad_sync_s"])
#: fewest feature frames a step feeds the encoder: its BatchNorm needs more than one value per
#: channel, i.e. more than 8 frames (one after the 8x subsampling) for a batch of one utterance
MIN_FRAMES = 16


def _rank_file(cfg: TrainConfig, kind: str, rank: int) -> Path:
    return Path(cfg.checkpoint_dir) / f"{kind}-rank-{rank:05d}.jsonl"


def _write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")


def _read_lines(path: Path, before_step: int) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]
    return [r for r in rows if int(r["step"]) < before_step]


def batch_digest(batch: Batch | PackedBatch) -> str:
    """SHA-256 over a batch's tensors (features, lengths, tokens; packed: the stream and its bounds), to compare runs."""
    h = hashlib.sha256()
    tensors = ((batch.features, batch.feature_lens, batch.input_ids, batch.position_ids, batch.cu_seqlens,
                batch.member_cu_seqlens) if isinstance(batch, PackedBatch)
               else (batch.features, batch.feature_lens, batch.tokens, batch.token_lens))
    for t in tensors:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def check_plan(cfg: TrainConfig, world_size: int) -> PlanMeta:
    """plan.json, after checking its world size and manifest against this run."""
    meta = read_plan_meta(cfg.plan_dir)
    if meta.world_size != world_size:
        raise DataprepError(f"{cfg.plan_dir}: the plan is for world size {meta.world_size} but {world_size} "
                            f"process(es) were started; use --nproc {meta.world_size} or re-plan")
    require_manifest_hash(cfg.manifest, meta.manifest.content_hash, "the plan's manifest")
    return meta


def _require_cuda(cfg: TrainConfig, last_local_rank: int) -> None:
    """With ``device="cuda"``: one line (:class:`OptionError` on ``device``) unless this machine
    has a CUDA device for every local rank up to ``last_local_rank``."""
    if cfg.device != "cuda":
        return
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n > last_local_rank:
        return
    why = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
           else f"{n} CUDA device(s) visible, {last_local_rank + 1} needed" if n else "no CUDA device is visible")
    raise OptionError("device", f"cuda: {why}; train with --device cpu (or auto: CUDA where there is one)")


def _init_rank(rank: int, world_size: int, cfg: TrainConfig, init_method: str, local_rank: int) -> torch.device:
    """Pick the device (``cuda:local_rank`` or CPU), share the CPU threads, join the process group."""
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=cfg.timeout_s))
    return device


def _build(cfg: TrainConfig, device: torch.device,
           meta: PlanMeta) -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer, BatchBuilder, int]:
    """(model, its DDP wrapper, optimizer, batch builder, n_mels), after checking the tokenizer
    fits the model's vocabulary. The model is initialized from ``cfg.seed``."""
    from oom.models import build_model, model_input_spec
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(cfg.seed)
    shape, pack = SPEECH_LLMS.get(cfg.model), meta.extra.get("pack")
    if pack is not None and shape is None:
        raise DataprepError(f"{cfg.plan_dir}: a packed plan (--pack {pack.get('max_tokens')}) trains a speech-LLM: "
                            f"--model {' or '.join(SPEECH_LLMS)}")
    model = (SpeechLLM(shape) if shape is not None else build_model(cfg.model)).to(device)
    n_mels, vocab = model_input_spec(model)
    dynres = meta.extra.get("dynamic_resolution") if cfg.dynamic_resolution else None
    kw: dict[str, Any] = {"features": FeatureConfig.named(cfg.features, features=n_mels),
                          "skip_bad_audio": cfg.skip_bad_audio, "resampler": cfg.resampler, "cache_dir": cfg.cache_dir,
                          "dynamic_resolution": DynResConfig.from_json(dynres["config"]) if dynres else None}
    if shape is not None:  # packed batches; a plan without --pack: one utterance a sequence
        same_rate = pack is not None and float(pack.get("audio_token_rate", 0)) == shape.audio_token_rate
        builder: BatchBuilder = PackedBatchBuilder(cfg.manifest, cfg.tokenizer, subsampling=shape.subsampling,
                                                   check_rate=same_rate, plan=str(cfg.plan_dir), **kw)
    else:
        builder = BatchBuilder(cfg.manifest, cfg.tokenizer, **kw)
    require_recorded_tokenizer(builder.tokenizers, cfg.manifest, cfg.allow_other_tokenizer)
    pieces = max(m.get_piece_size() for m in builder.tokenizers.models.values())
    if pieces > vocab:
        raise DataprepError(f"tokenizer has {pieces} pieces but model {cfg.model!r} has a {vocab}-entry vocabulary")
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=cfg.lr)
    return model, ddp, opt, builder, n_mels


def _resume(ckpt_path: Path, meta: PlanMeta, model: torch.nn.Module, opt: torch.optim.Optimizer,
            device: torch.device) -> int:
    """Load model and optimizer state from ``ckpt_path``; the plan step to continue at."""
    ckpt = load_checkpoint(ckpt_path, device)
    next_step = ckpt["next_step"]
    resume_point(meta, ckpt["plan_hash"], next_step, argument_validator(str(ckpt_path)))
    try:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise DataprepError(f"{ckpt_path}: model: does not fit this model / optimizer "
                            f"({str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__})") from None
    return next_step


class GradSyncClock:
    """When a rank's backward has computed its gradients, apart from the wait for the other ranks.

    DDP's all-reduce makes every rank wait for the slowest, so a forward + backward timed to its
    end measures the slowest rank on every rank. A communication hook (DDP's default all-reduce,
    wrapped) notes when each gradient bucket is ready; the last one's time ends the rank's own
    compute. :meth:`split` gives (forward + backward, gradient sync) seconds of a step from its
    start and the all-reduce's end. On CUDA the time is a CUDA event recorded on the stream;
    on CPU, ``timer`` (default ``time.perf_counter``; ``time.thread_time`` gives the rank's CPU
    seconds, what a quiet host gives when the host is shared).
    """

    def __init__(self, ddp: torch.nn.Module, device: torch.device,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.cuda = device.type == "cuda"
        self.timer = timer
        self._t0 = 0.0
        self._start: Any = None
        self._ready: Any = None
        ddp.register_comm_hook(None, self._hook)  # type: ignore[operator]

    def start(self) -> float:
        """Mark a step's start (before its forward); returns the time."""
        self._ready = None
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        self._t0 = self.timer()
        return self._t0

    def _hook(self, state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses other annotations than its own
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if self.cuda:
            self._ready = torch.cuda.Event(enable_timing=True)
            self._ready.record()
        else:
            self._ready = self.timer()
        return allreduce_hook(state, bucket)

    def split(self, t_synced: float) -> tuple[float, float]:
        """(forward + backward, gradient sync) seconds of the step started by :meth:`start`, whose
        all-reduce had ended at ``t_synced`` (device synchronized); no bucket: all of it compute."""
        if self._ready is None:
            return t_synced - self._t0, 0.0
        ready = self._t0 + self._start.elapsed_time(self._ready) / 1e3 if self.cuda else self._ready
        ready = min(max(ready, self._t0), t_synced)
        return ready - self._t0, t_synced - ready


def _optimizer_step(ddp: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch | PackedBatch, device: torch.device,
                    n_mels: int, clock: GradSyncClock) -> tuple[torch.Tensor, float, float, float]:
    """Forward, backward and one optimizer step on ``batch``; the loss and the seconds of the
    rank's own forward + backward, of the gradient all-reduce's wait and of the optimizer step."""
    from oom.models import loss as model_loss

    clock.start()
    if isinstance(batch, PackedBatch):
        loss = _packed_loss(ddp, batch, device, n_mels)
    elif batch.size:
        feats, flens = batch.features.to(device, non_blocking=True), batch.feature_lens.to(device)
        if feats.shape[1] < MIN_FRAMES:  # a tiny clip alone in its batch: pad frames (lengths stay real)
            feats = torch.nn.functional.pad(feats, (0, 0, 0, MIN_FRAMES - feats.shape[1]))
        toks, tlens = batch.tokens.to(device), batch.token_lens.to(device)
        loss = model_loss(ddp, feats, flens, toks, tlens)
    else:  # every utterance skipped: a zero-weight step keeps DDP's all-reduce in step
        feats = torch.zeros(1, MIN_FRAMES, n_mels, device=device)
        loss = 0.0 * model_loss(ddp, feats, torch.tensor([MIN_FRAMES], device=device),
                                torch.zeros(1, 2, dtype=torch.int64, device=device),
                                torch.tensor([2], device=device))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    t1 = _synchronized(device)
    fb_s, sync_s = clock.split(t1)
    opt.step()
    t2 = _synchronized(device)
    return loss, fb_s, sync_s, t2 - t1


def _packed_loss(ddp: torch.nn.Module, batch: PackedBatch, device: torch.device, n_mels: int) -> torch.Tensor:
    """Mean token loss of a packed batch (every member skipped: a zero-weight step on one
    silent member keeps DDP's all-reduce in step)."""
    if not batch.size:
        zero = Batch(batch.epoch, batch.step, batch.bucket, ["-"], torch.zeros(1, MIN_FRAMES, n_mels),
                     torch.tensor([MIN_FRAMES]), torch.zeros(1, 2, dtype=torch.int64), torch.tensor([2]))
        return 0.0 * packed_loss(ddp, collate_packed(zero, [0], 1).to(device))[0]
    total, n = packed_loss(ddp, batch.to(device))
    return total / max(n, 1)


def _synchronized(device: torch.device) -> float:
    """The time once ``device``'s queued work is done (seconds, ``time.perf_counter``)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def write_step_times(path: Path, rows: list[dict[str, Any]]) -> None:
    """A rank's step log (what ``dataprep calibrate`` reads), atomically."""
    table = pa.Table.from_pylist(rows, schema=STEP_TIMES_SCHEMA)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_step_times(path: Path, before_step: int) -> list[dict[str, Any]]:
    """The rows of a rank's step log before ``before_step`` (a resumed run keeps them)."""
    if not path.exists():
        return []
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataprepError(f"{path}: not a readable step log ({str(exc).splitlines()[0][:160]}); "
                            "remove it to start the log afresh") from None
    if table.schema.remove_metadata() == _STEP_TIMES_V1:
        table = table.append_column("grad_sync_s", pa.nulls(table.num_rows, pa.float64()))
    if table.schema.remove_metadata() != STEP_TIMES_SCHEMA:
        raise DataprepError(f"{path}: columns differ from a step log's ({', '.join(STEP_TIMES_SCHEMA.names)})")
    return [r for r in table.to_pylist() if r["step"] < before_step]


def _step_line(step: int, batch: Batch | PackedBatch, loss: torch.Tensor, device: torch.device,
               t_prev: float) -> tuple[dict[str, Any], float]:
    """The step's log line (loss and padding summed over ranks: an all-reduce) and the time now."""
    rf, pf, rt, pt = batch.padding_counts()
    stats = torch.tensor([float(loss.detach()) * batch.size, batch.size, rf, pf, rt, pt],
                         dtype=torch.float64, device=device)
    dist.all_reduce(stats)
    now = time.perf_counter()
    s = stats.tolist()
    line = {"step": step, "epoch": batch.epoch, "bucket": batch.bucket,
            "loss": round(s[0] / s[1], 5) if s[1] else None, "utterances": int(s[1]),
            "padding_audio": round(1 - s[2] / s[3], 5) if s[3] else 0.0,
            "padding_tokens": round(1 - s[4] / s[5], 5) if s[5] else 0.0,
            "utt_per_s": round(s[1] / max(now - t_prev, 1e-9), 2)}
    return line, now


def run_rank(rank: int, world_size: int, cfg: TrainConfig, init_method: str, local_rank: int = 0) -> dict[str, Any]:
    """Train as ``rank`` of ``world_size``; returns rank 0's summary (others: their own)."""
    device = _init_rank(rank, world_size, cfg, init_method, local_rank)
    try:
        meta = check_plan(cfg, world_size)
        model, ddp, opt, builder, n_mels = _build(cfg, device, meta)
        clock = GradSyncClock(ddp, device)
        ckpt_path = Path(cfg.checkpoint_dir) / "last.pt"
        start = _resume(ckpt_path, meta, model, opt, device) if cfg.resume else 0
        stop = min(meta.num_steps, cfg.steps if cfg.steps is not None else meta.num_steps)
        trace = _read_lines(_rank_file(cfg, "trace", rank), start) if cfg.trace else []
        skipped = _read_lines(_rank_file(cfg, "skipped", rank), start)
        times_path = Path(cfg.checkpoint_dir) / f"steps-rank-{rank:05d}.parquet"
        times = read_step_times(times_path, start)
        log = _read_lines(Path(cfg.checkpoint_dir) / "log.jsonl", start) if rank == 0 else []
        n_skipped_before = len(skipped)
        loader = make_loader(PlanDataset(cfg.plan_dir, rank, builder, start, stop, prefetch=PrefetchOptions(
            cfg.prefetch_steps, cfg.prefetch_bytes)), cfg.workers, cfg.prefetch)

        def save(next_step: int) -> None:
            if rank == 0:
                with atomic_path(ckpt_path) as tmp:
                    save_checkpoint(tmp, {"next_step": next_step, "model": model.state_dict(),
                                          "optimizer": opt.state_dict(), "plan_hash": meta.plan_hash,
                                          "config": asdict(cfg)})
                _write_lines(Path(cfg.checkpoint_dir) / "log.jsonl", log)
            if cfg.trace:
                _write_lines(_rank_file(cfg, "trace", rank), trace)
            if skipped:
                _write_lines(_rank_file(cfg, "skipped", rank), skipped)
            write_step_times(times_path, times)
            dist.barrier()

        step = start
        t_prev = time.perf_counter()
        t_done = time.perf_counter()
        for batch in loader:
            t_ready = time.perf_counter()
            if batch.step != step:
                raise DataprepError(f"{cfg.plan_dir}: rank {rank} expected step {step}, shard gave {batch.step}")
            torch.manual_seed(hash((cfg.seed, step, rank)) & 0x7FFFFFFF)
            if cfg.trace:
                trace.append({"step": step, "epoch": batch.epoch, "bucket": batch.bucket, "ids": batch.ids,
                              "sha256": batch_digest(batch)})
            skipped.extend(batch.skipped)
            loss, fb_s, sync_s, opt_s = _optimizer_step(ddp, opt, batch, device, n_mels, clock)
            times.append({"rank": rank, "step": step, "data_wait_s": t_ready - t_done, "forward_backward_s": fb_s,
                          "optimizer_s": opt_s, "grad_sync_s": sync_s})
            line, t_prev = _step_line(step, batch, loss, device, t_prev)
            if rank == 0:
                log.append(line)
                if not cfg.quiet:
                    print(json.dumps(line), flush=True)
            step += 1
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < stop:
                save(step)
            t_done = time.perf_counter()
        if step != stop:
            raise DataprepError(f"{cfg.plan_dir}: rank {rank} ran {step - start} steps, expected {stop - start}")
        save(step)
        return {"rank": rank, "start_step": start, "next_step": step, "steps_run": step - start,
                "skipped": len(skipped) - n_skipped_before, "last": log[-1] if log else None}
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(rank: int, world_size: int, cfg: TrainConfig, init_method: str, errq: Any, environ: dict[str, str]) -> None:
    import faulthandler
    import signal

    os.environ.clear()  # the launching process's environment now (store credentials, ...), not the
    os.environ.update(environ)  # one the forkserver was started with for an earlier run
    faulthandler.register(signal.SIGTERM, chain=True)  # a rank killed for hanging shows where it hung
    try:
        run_rank(rank, world_size, cfg, init_method, local_rank=rank)
    except DataprepError as exc:
        errq.put((rank, "user", str(exc)))
        sys.exit(2)
    except BaseException as exc:  # noqa: BLE001  (reported by the parent)
        errq.put((rank, "crash", "".join(traceback.format_exception_only(type(exc), exc)).strip()))
        sys.exit(1)


def train(cfg: TrainConfig, nproc: int = 1) -> dict[str, Any]:
    """Run training: under torchrun (env ``RANK``/``WORLD_SIZE``) as that one rank; else spawn
    ``nproc`` local ranks and wait (at most ``cfg.timeout_s``; a hung rank is killed and reported).
    """
    if not isinstance(cfg, TrainConfig):
        raise DataprepError(f"train: cfg must be a TrainConfig, got {type(cfg).__name__}")
    check_int("nproc", nproc, ge=1)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    _require_cuda(cfg, int(os.environ.get("LOCAL_RANK", "0")) if torchrun else nproc - 1)
    if not (torchrun and cfg.overwrite and os.environ["RANK"] != "0"):  # rank 0 alone removes an old run
        require_free_checkpoint_dir(cfg.checkpoint_dir, cfg.resume, cfg.overwrite)
    Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    if torchrun:
        return run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), cfg, "env://",
                        local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    check_plan(cfg, nproc)  # fail before starting processes
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    if nproc == 1:
        return run_rank(0, 1, cfg, init_method)
    # forkserver: one clean server process imports torch once (slow on small machines) and
    # forks every rank from it; no OpenMP state is inherited, unlike a plain fork of this process
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["dataprep.training.loop", "oom.models", "torch._dynamo"])  # DDP imports _dynamo
    errq = ctx.SimpleQueue()
    procs = [ctx.Process(target=_child, args=(r, nproc, cfg, init_method, errq, dict(os.environ)), daemon=False)
             for r in range(nproc)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + cfg.timeout_s + 30
    try:
        while any(p.is_alive() for p in procs):
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        failed = [p for p in procs if p.exitcode not in (None, 0)]
        hung = [r for r, p in enumerate(procs) if p.is_alive()] if not failed else []
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    errors = []
    while not errq.empty():
        errors.append(errq.get())
    if errors:
        user = [e for e in errors if e[1] == "user"]
        rank, kind, msg = sorted(user or errors)[0]
        if kind == "user":
            raise DataprepError(msg)
        raise RuntimeError(f"rank {rank} crashed: {msg}")
    if failed:
        raise RuntimeError(f"rank {procs.index(failed[0])} exited with status {failed[0].exitcode}")
    if hung:
        raise DataprepError(f"training did not finish within {cfg.timeout_s:.0f} s; ranks {hung} still running (killed)")
    logs = [json.loads(x) for x in (Path(cfg.checkpoint_dir) / "log.jsonl").read_text().splitlines() if x]
    ckpt_step = int(load_checkpoint(Path(cfg.checkpoint_dir) / "last.pt")["next_step"])
    return {"rank": 0, "next_step": ckpt_step, "last": logs[-1] if logs else None}

