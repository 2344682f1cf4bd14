"""A blend YAML in NeMo's idioms read by NeMo 3.0's own ``input_cfg`` reader and by ``compile``:
the same rows, tags, Canary prompt slots and shares (:func:`build_blend` makes the corpora)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from bucketing.quota import blend_probabilities
from dataprep.cli import app
from dataprep.testing import WORDS
from dataprep.tokenize import train_model
from manifests.manifest_read import read_manifest
from manifests.readers import read_blend
from manifests.records import custom_for_row
from tests.conftest import needs_module
from tests.manifests.test_blend_idioms import ENV, build_blend, build_shar_blend

pytestmark = [pytest.mark.nemo,
              needs_module("nemo.collections.common.data.lhotse", "nemo_toolkit is not installed (make test-nemo)")]

#: Canary 2's prompt slots (nemo.collections.common.prompts.canary2.canary2): required, then optional defaults
SLOTS = {"source_lang": None, "target_lang": None, "decodercontext": "", "emotion": "<|emo:undefined|>",
         "itn": "<|noitn|>", "timestamp": "<|notimestamp|>", "diarize": "<|nodiarize|>", "pnc": "<|pnc|>"}


def _slots(custom: dict[str, Any], language: str | None) -> tuple[Any, ...]:
    """Canary 2's user-turn slot values and the answer's language, as ``canary2`` reads a cut."""
    return (*(custom.get(k, v) for k, v in SLOTS.items()),
            language if language is not None else custom.get("target_lang"))


def _nemo_shares(node: Any, p: float, out: dict[tuple[str, str], float]) -> None:
    """Probability of each NeMo leaf iterator ((manifest, text_field) -> p), from the muxes'
    weights NeMo built (normalized as Lhotse's multiplexer draws them)."""
    from lhotse import CutSet
    from lhotse.lazy import LazyIteratorMultiplexer
    from nemo.collections.common.data.lhotse.nemo_adapters import LazyNeMoIterator

    if isinstance(node, CutSet):
        node = node.data
    if isinstance(node, LazyIteratorMultiplexer):
        total = float(sum(node.weights))
        for it, w in zip(node.iterators, node.weights):
            _nemo_shares(it, p * float(w) / total, out)
    elif isinstance(node, LazyNeMoIterator):
        key = (str(Path(str(node.path)).resolve()), node.text_field)
        out[key] = out.get(key, 0.0) + p
    else:
        _nemo_shares(node.iterator, p, out)  # a map (tags) or a repeat


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any], pl.DataFrame]:
    from nemo.collections.common.data.lhotse.cutset import read_cutset_from_config
    from omegaconf import OmegaConf

    root = tmp_path_factory.mktemp("nemo_blend")
    blend = build_blend(root)
    train_model([" ".join(WORDS)] * 4, root / "spm.model", vocab_size=80, threads=1)
    mp = pytest.MonkeyPatch()
    mp.setenv(ENV, str(root))
    mp.chdir(root)  # NeMo resolves relative paths (sub.yaml, x/m.json) against the working folder
    try:
        cfg = OmegaConf.load(blend)  # as Hydra reads a train_ds
        cfg.metadata_only, cfg.force_finite, cfg.shard_seed = True, True, 0
        cuts, _ = read_cutset_from_config(cfg)
        theirs = list(cuts)
        res = CliRunner().invoke(app, ["compile", str(blend), "--tokenizer", str(root / "spm.model"),
                                       "-o", str(root / "m.parquet")])
        assert res.exit_code == 0, res.output
        shares: dict[tuple[str, str], float] = {}
        _nemo_shares(cuts, 1.0, shares)
    finally:
        mp.undo()
    return root, [theirs, shares], read_manifest(root / "m.parquet")


def test_same_rows_tags_and_prompts_as_nemo(both: tuple[Path, list[Any], pl.DataFrame]) -> None:
    _, (theirs, _), ours = both
    keys = ("leaf", "pnc", "taskname", "source_lang", "target_lang")
    nemo_rows = Counter(  # the audio by name (a tar member's: NeMo reads tarred manifests' names as they are)
        (Path(c.recording.id).name, c.supervisions[0].text,
         *(c.custom.get(k) for k in keys), _slots(c.custom, c.supervisions[0].language)) for c in theirs)
    our_rows: Counter[Any] = Counter()
    for row in ours.iter_rows(named=True):
        custom = custom_for_row(row)
        our_rows[(Path(row["audio_path"].rpartition(":")[2]).name, row["text"], *(custom.get(k) for k in keys),
                  _slots(custom, row["lang"]))] += 1
    assert sum(nemo_rows.values()) == ours.height == 46
    assert our_rows == nemo_rows
    assert Counter(c.custom["pnc"] for c in theirs if c.custom["leaf"] != "xy") == {"yes": 40}


def test_same_shares_as_nemo(both: tuple[Path, list[Any], pl.DataFrame]) -> None:
    root, (_, shares), _ = both
    mp = pytest.MonkeyPatch()
    mp.setenv(ENV, str(root))
    try:
        blend = read_blend(root / "blend.yaml")
    finally:
        mp.undo()
    probs = blend_probabilities(blend.tree())
    ours = {(leaf.paths[0], leaf.text_field): probs[leaf.corpus] for leaf in blend.leaves}
    assert ours.keys() == shares.keys()
    for key, p in shares.items():
        assert ours[key] == pytest.approx(p, rel=1e-12), key
    assert json.dumps(sorted(ours.values()))  # four leaves, each its own share
    assert len(ours) == 4


def test_shar_forms_same_rows_and_shares_as_nemo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lhotse.shar import LazySharIterator
    from nemo.collections.common.data.lhotse.cutset import read_cutset_from_config
    from omegaconf import OmegaConf

    blend = build_shar_blend(tmp_path)
    train_model([" ".join(WORDS)] * 4, tmp_path / "spm.model", vocab_size=80, threads=1)
    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({"input_cfg": str(blend), "metadata_only": True, "force_finite": True, "shard_seed": 0})
    cuts, _ = read_cutset_from_config(cfg)
    theirs = Counter((c.id, c.supervisions[0].text, c.custom["leaf"]) for c in cuts)
    res = CliRunner().invoke(app, ["compile", str(blend), "--tokenizer", str(tmp_path / "spm.model"), "-o",
                                   str(tmp_path / "m.parquet")])
    assert res.exit_code == 0, res.output
    ours = Counter((row["id"].rpartition(":")[2], row["text"], json.loads(row["extra"])["leaf"])
                   for row in read_manifest(tmp_path / "m.parquet").iter_rows(named=True))
    assert ours == theirs and sum(ours.values()) == 14

    shares: dict[str, float] = {}

    def walk(node: Any, p: float) -> None:
        from lhotse import CutSet
        from lhotse.lazy import LazyIteratorMultiplexer

        node = node.data if isinstance(node, CutSet) else node
        if isinstance(node, LazyIteratorMultiplexer):
            for it, w in zip(node.iterators, node.weights):
                walk(it, p * float(w) / float(sum(node.weights)))
        elif isinstance(node, LazySharIterator):
            folder = Path(str(node.streams["cuts"][0])).parent.name
            shares[folder] = shares.get(folder, 0.0) + p
        else:
            walk(node.iterator, p)

    walk(cuts, 1.0)
    blend_ = read_blend(blend)
    probs = blend_probabilities(blend_.tree())
    ours_p: dict[str, float] = {}
    for leaf in blend_.leaves:  # the list leaf (NeMo: muxed by size) splits by its folders' cuts
        sizes = {"s1": 1} if leaf.tars else {Path(p).name: sum(1 for _ in LazySharIterator(in_dir=p))
                                             for p in leaf.paths}
        for folder, n in sizes.items():
            ours_p[folder] = ours_p.get(folder, 0.0) + probs[leaf.corpus] * n / sum(sizes.values())
    assert ours_p.keys() == shares.keys()
    for k, p in shares.items():
        assert ours_p[k] == pytest.approx(p, rel=1e-12), k


@pytest.mark.parametrize("text", [
    "root: ${oc.env:DP_ROOT}\nm: ${root}/a.json\nn: ${oc.env:DP_UNSET,null}\nd: ${oc.env:DP_UNSET,'/x'}\n",
    "e: ${oc.env:DP_UNSET,1.5}\nf: ${oc.env:DP_UNSET,true}\ng: '${oc.env:DP_ROOT}-${oc.env:DP_UNSET,7}'\n",
    "w: ${oc.decode:'2.5'}\nv: ${oc.decode:${oc.env:DP_NUM}}\nsub:\n  a: ${..w}\n  b: ${.a}\n  c: x${.a}y\n",
    "lit: '\\${root}'\nnums: [6e-1, 1e3, 1_000, 0x10, .5, +2, 1.5e-3, 12:30]\nl: [1, '${nums[0]}']\nt: ${l}\n",
    "day: 2001-12-14\nyes_: yes\nsp: ${oc.decode:' 7 '}\nq: '${oc.env:DP_UNSET, \"a b\"}'\nr: ${oc.env:DP_UNSET, x y }\n",
    "a: ${oc.select:missing,3}\nb: ${oc.select:a,4}\nc: '${oc.env:DP_UNSET,\"q,r\"}'\nd: ${oc.decode:null}\n",
    "a: {x: 1}\nb: ${a}\nc: ${a.x}\nd: ${b.x}\ne: 'str ${a.x} and ${c}'\nf: [${c}, ${a.x}]\n".replace("[${c}, ${a.x}]",
                                                                                                  "['${c}', '${a.x}']"),
])
def test_yaml_as_omegaconf_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    from omegaconf import OmegaConf

    from manifests.nemo_yaml import load_nemo_yaml

    monkeypatch.setenv("DP_ROOT", "/data")
    monkeypatch.setenv("DP_NUM", "42")
    monkeypatch.delenv("DP_UNSET", raising=False)
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    assert load_nemo_yaml(tmp_path / "c.yaml") == OmegaConf.to_container(OmegaConf.load(tmp_path / "c.yaml"),
                                                                          resolve=True)
