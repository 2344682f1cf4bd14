"""Shared fixtures: where ../shared/data is, and a sentencepiece model trained on it; the
xdist groups of ``make test``; the docs pages' demo started in the background."""

from __future__ import annotations

import os

#: under xdist each worker gets its share of the cores for its thread pools (torch's OpenMP,
#: BLAS, polars), set before any of them is imported: ``make test`` runs 2 workers on 2 cores,
#: and a worker's 2 OpenMP threads (4 with 2 DDP ranks) spinning against the other's cost a
#: third of the training tests' time
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "POLARS_MAX_THREADS"):
        os.environ.setdefault(_var, _share)

import importlib.util
import io
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import sentencepiece as spm
import typer.testing
from hypothesis import HealthCheck, settings

# a loaded 2-core CI machine must not turn slow example generation into failures, and CI runs
# the same examples every time (explore more locally with HYPOTHESIS_PROFILE=explore)
settings.register_profile("repo", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          derandomize=True)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repo"))
#: the example count of the slowest properties (each example a command run or a plan written):
#: what ``make test`` affords on 2 cores, and ten times that under HYPOTHESIS_PROFILE=explore
SLOW_EXAMPLES = 200 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 20
#: the example count of the properties whose examples each compile, pack or plan out of core
#: several times over (seconds an example): a handful on 2 cores, ten times that under explore
FEW_EXAMPLES = 60 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 6

REPO = Path(__file__).resolve().parents[1]
_typer_command = getattr(typer.testing, "_get_command", None)


def _cli_command(typer_app: typer.Typer) -> Any:
    """``CliRunner.invoke(app, ...)`` runs the command the ``dataprep`` script runs, built once per
    process (:func:`dataprep.cli.command`): typer builds it anew at each call, 70 ms of annotations
    evaluated again, a minute of CPU over the suite's thousand or so invocations."""
    from dataprep.cli import app, command

    return command() if typer_app is app else _typer_command(typer_app)  # type: ignore[misc]


if _typer_command is not None:  # typer's name for it; where it has another, each call builds it
    typer.testing._get_command = _cli_command  # type: ignore[attr-defined]
#: every test process has its own cache folder (store headers, tar indexes, step indexes, OOM
#: probes), never the user's ~/.cache/speech-dataprep: facts left there by an earlier run (same
#: loopback bucket names, same bytes, same ETags) would answer what a test means to read
os.environ["SPEECH_DATAPREP_CACHE"] = tempfile.mkdtemp(prefix="speech-dataprep-test-cache-")
#: real corpus metadata lives beside the repository, never inside it
SHARED_DATA = Path(os.environ.get("SPEECH_DATAPREP_SHARED_DATA", REPO.parent / "shared" / "data"))
#: set by `make test` (what CI runs): every optional integration is installed there, so a test
#: skipped because a module is missing (NeMo, Lightning, Ray, ...) is a failure, not a skip
FULL_SUITE = os.environ.get("SPEECH_DATAPREP_FULL_SUITE") == "1"
_MISSING_MODULE = ("not installed", "could not import", "No module named")


def _missing_module_is_a_failure(rep: pytest.TestReport | pytest.CollectReport) -> None:
    """Under the full suite, turn a skip for a missing module into a failure that says so."""
    if FULL_SUITE and rep.skipped and isinstance(rep.longrepr, tuple):
        reason = str(rep.longrepr[2])
        if any(m in reason for m in _MISSING_MODULE):
            rep.outcome = "failed"
            rep.longrepr = f"skipped for a missing module under SPEECH_DATAPREP_FULL_SUITE=1 (make test): {reason}"


#: the files that import NeMo (12 s of CPU), in the test process or in the server their trainers'
#: runs are forked from (:func:`tests.warm_python.run_python`): one group, on one worker, so a run
#: pays each of those imports once; none of them imports NeMo at collection (:func:`needs_module`)
NEMO_FILES = tuple(f"tests/{name}.py" for name in (
    "test_readme_examples", "integrations/test_nemo_packed", "integrations/test_lightning_steps",
    "integrations/test_nemo_resume", "integrations/test_nemo", "integrations/test_nemo_models",
    "integrations/test_nemo_dynres", "integrations/test_nemo_resample", "integrations/test_nemo_channel_field",
    "integrations/test_nemo_tokenizer_choice", "integrations/test_export_blend", "integrations/test_pack",
    "training/test_features_nemo", "analysis/test_token_equivalents_nemo", "manifests/test_blend_nemo",
    "manifests/test_blend_idioms", "compile/test_text_blend_nemo", "compile/test_prompt_format"))


#: the files whose tests start ranks or DataLoader workers from multiprocessing's forkserver in the
#: test process (``train --nproc N``): one group, on one worker, which starts that server (a fresh
#: interpreter importing torch: 6 s on a loaded machine) once
FORKSERVER_FILES = tuple(f"tests/{name}.py" for name in (
    "training/test_train_ddp", "training/test_train_replan", "training/test_train_prefetch_s3",
    "training/test_loader", "integrations/test_prefetch"))


def needs_module(name: str, reason: str) -> pytest.MarkDecorator:
    """Skip where ``name``'s package is not installed, found without importing it: a test module
    that imported NeMo at its top would have every xdist worker pay that import at collection."""
    return pytest.mark.skipif(importlib.util.find_spec(name.split(".")[0]) is None, reason=reason)

#: the longest groups (a test file, or a docs page), longest first as measured by ``make test``:
#: ``--no-loadscope-reorder`` hands groups to the workers in collection order, so these start
#: first and the run does not end waiting on one of them (xdist's own order is by test count,
#: which put the docs pages, one test each, last); the docs pages after a first wave, by when
#: the demo they share is built
LONGEST_FIRST = (
    "nemo", "tests/test_benchmarks.py", "forkserver", "tests/compile/test_parts.py", "docs:trainers.md",
    "tests/report/test_report_browser.py", "tests/cli/test_replan_cli.py", "tests/oom/test_fit.py",
    "tests/integrations/test_pack_round4.py", "docs:oomptimize.md", "tests/hostile/test_training.py",
    "tests/cli/test_cli_surface.py", "tests/oom/test_estimate.py", "docs:containers.md", "tests/cli/test_out_of_core.py",
    "docs:plans.md", "tests/test_layout.py", "tests/integrations/test_samplers.py", "docs:compile.md",
    "tests/manifests/test_readers.py", "tests/oom/test_transducer.py", "tests/cli/test_buckets_cli.py",
    "tests/training/test_train_packed.py", "tests/integrations/test_packed_consumers.py", "tests/analysis/test_stats.py",
    "tests/test_pipeline_golden.py", "tests/storage/test_storage.py", "docs:many-corpora.md",
    "tests/hostile/test_properties.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``-n 2 --dist loadgroup`` (``make test``) a file's tests stay on one worker, so its
    module fixtures are built once, unless a test names its own ``xdist_group`` (the docs pages:
    each page runs on whichever worker is free, the demo they share built once per session);
    the groups of :data:`LONGEST_FIRST` first, in its order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            file = item.nodeid.split("::", 1)[0]
            group = "nemo" if file in NEMO_FILES else "forkserver" if file in FORKSERVER_FILES else file
            item.add_marker(pytest.mark.xdist_group(group))
    order = {id(item): (rank.get(item.get_closest_marker("xdist_group").args[0], len(rank)), i)  # type: ignore[union-attr]
             for i, item in enumerate(items)}
    items.sort(key=lambda item: order[id(item)])


def docs_demo_root(factory: pytest.TempPathFactory) -> Path:
    """Where the docs pages' demo workspace is built: the run's temporary folder, the one the
    workers share under xdist (:mod:`tests.docs_demo`)."""
    base = factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "docs-demo"


_BUILDERS: list[subprocess.Popen[bytes]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """When docs pages will run, the first process to get here starts building their demo in
    the background (it holds the workspace's lock while it builds): the pages come late in the
    run, by then it is ready, and no worker waits for it idle."""
    if not any(i.nodeid.startswith("tests/test_docs_examples.py::test_page_blocks_run") for i in session.items):
        return
    root = docs_demo_root(session.config._tmp_path_factory)  # type: ignore[attr-defined]
    root.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(root / "started", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    _BUILDERS.append(subprocess.Popen([sys.executable, "-m", "tests.docs_demo", str(root)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    _missing_module_is_a_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    """A module skipped whole (``importorskip`` at its top) is reported at collection."""
    outcome = yield
    _missing_module_is_a_failure(outcome.get_result())


def shared_file(name: str) -> Path:
    """Path of a file under ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"{path} not found: real corpus metadata (../shared/data) is absent")
    return path


def read_shared_csv(name: str) -> pl.DataFrame:
    """A ../shared/data CSV (id, duration, text, lang[, split]) as a frame."""
    return pl.read_csv(shared_file(name), infer_schema_length=0).with_columns(pl.col("duration").cast(pl.Float64))


@pytest.fixture(scope="session")
def shared_spm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1024-piece sentencepiece model trained on LibriSpeech + Common Voice transcripts (every
    k-th, about 20,000). The same bytes in every run: sentencepiece's own sampling
    (``input_sentence_size`` with ``shuffle_input_sentence``) drew other sentences in each process
    even seeded, and the token counts, hence the padding figures, moved with it."""
    texts = []
    for name in ("librispeech.train-clean-100.csv", "commonvoice.id_ps.csv"):
        texts += read_shared_csv(name)["text"].drop_nulls().to_list()
    texts = texts[::-(-len(texts) // 20000)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, vocab_size=1024, model_type="unigram",
        character_coverage=1.0, input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=2, minloglevel=2,
    )
    path = tmp_path_factory.mktemp("spm") / "shared-1024.model"
    path.write_bytes(buf.getvalue())
    return path


def manifest_from_csv(name: str, spm_path: Path, prompt_tokens: int = 9) -> pl.DataFrame:
    """A compiled-manifest frame from a ../shared/data CSV, built without ``dataprep compile``:
    ``num_tokens`` = sentencepiece pieces + ``prompt_tokens``, ``tps`` = num_tokens / duration (s),
    ``origin`` = ``<csv>:<line>`` (header is line 1), the ``split`` column (if any) kept in ``extra``."""
    df = read_shared_csv(name)
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    pieces = [len(p) for p in sp.encode(df["text"].fill_null("").to_list())]
    extra = (
        pl.concat_str([pl.lit('{"split": "'), pl.col("split"), pl.lit('"}')])
        if "split" in df.columns else pl.lit(None, pl.String)
    )
    return df.with_columns(
        pl.format("{}.wav", pl.col("id")).alias("audio_path"),
        (pl.Series("num_tokens", pieces, dtype=pl.Int64) + prompt_tokens).alias("num_tokens"),
        pl.format(f"{name}:{{}}", pl.int_range(2, df.height + 2)).alias("origin"),
        extra.alias("extra"),
    ).with_columns((pl.col("num_tokens") / pl.col("duration")).alias("tps"))


#: fast retries for the store tests: a fault costs milliseconds, a give-up under a second
STORE_TEST_ENV = {"DATAPREP_STORE_ATTEMPTS": "4", "DATAPREP_STORE_BACKOFF_S": "0.01", "DATAPREP_STORE_TIMEOUT_S": "2"}


@pytest.fixture(scope="session")
def loopback_s3() -> Iterator[Any]:
    """A real S3 API on loopback (moto's server behind a fault-injecting proxy), one per test
    process: its dummy credentials and endpoint are in the environment only while it runs
    (subprocesses of a test inherit them). Defined here, never imported into a test module: a
    second definition would start a second proxy over the same moto backend (moto's state is
    the process's) and take over the environment, so one test's fault rules would not apply."""
    pytest.importorskip("moto.server", reason="moto's server mode is not installed (pip install 'moto[server]')")
    pytest.importorskip("obstore", reason="obstore is not installed (pip install 'speech-dataprep[store]')")
    from dataprep.testing_store import LoopbackS3
    from manifests import storage

    server = LoopbackS3()
    env = {**server.env(), **STORE_TEST_ENV}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    storage.reset_clients()
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        storage.reset_clients()
        server.close()


@pytest.fixture()
def s3(loopback_s3: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The loopback store with no fault rules and its counters at zero; ``s3.bucket`` is a
    fresh bucket URL for this test (``s3://t-<test name>``)."""
    from manifests import storage

    loopback_s3.clear_faults()
    bucket = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:50].strip("-")
    loopback_s3.bucket = loopback_s3.create_bucket(bucket)
    storage.reset_clients()
    loopback_s3.reset_counts()
    yield loopback_s3
    loopback_s3.clear_faults()
