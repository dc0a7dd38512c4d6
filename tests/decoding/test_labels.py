"""One label-value rule (``monitor/decoding/labels.py``), held by the decoder and by every settings
field that becomes a label value.

``$`` also matches before a trailing newline: three copies of the rule that ended in ``$`` took
``"probe\\n"`` as a probe name. Each site gets the values a copy of the rule could let through.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from pydantic import BaseModel, ValidationError

from monitor.canary.settings import CanarySettings
from monitor.config import Settings
from monitor.decoding.decoder import Decoder
from monitor.decoding.labels import LabelValue, check_label_value, is_label_value
from monitor.decoding.settings import LimitSettings
from monitor.drift.settings import DaemonReferenceSettings
from monitor.index.settings import IndexProbeSpec
from monitor.retrieval.settings import ClickProbeSettings, GoldenProbeSettings, KnnRetrieverSettings, ModelStream
from monitor.scaleout.settings import ScaleOutSettings
from monitor.serving.settings import EndpointSettings

REFUSED = {
    "trailing newline": "x\n",
    "NUL": "x\x00y",
    "65 characters": "m" * 65,
    "non-ASCII": "modèle",
    "non-ASCII digit": "m\u0663",
    "empty": "",
    "space": "a b",
}
ACCEPTED = ["m", "minilm-v2", "org/model@1.2+cpu:x_y", "m" * 64]

Site = Callable[[str, Path], object]


def pinned_reference(value: str, tmp_path: Path) -> object:
    path = tmp_path / "reference.npy"
    np.save(path, np.ones((4, 3), dtype=np.float32))
    return DaemonReferenceSettings.model_validate({"pinned": {value: str(path)}})


def golden_probe(value: str, tmp_path: Path) -> object:
    (tmp_path / "golden.jsonl").touch()
    return GoldenProbeSettings.model_validate({
        "name": "g", "model": value, "file": str(tmp_path / "golden.jsonl"), "retriever": {"kind": "knn"}})


def index_probe(name: str, model: str, tmp_path: Path) -> object:
    return IndexProbeSpec.model_validate({"name": name, "model": model, "engine": "lancedb",
                                          "lancedb": {"uri": str(tmp_path), "table": "docs"}})


SITES: dict[str, Site] = {
    "retrieval probe name": lambda v, _: ClickProbeSettings.model_validate({"name": v}),
    "retrieval model (Label)": lambda v, _: ModelStream.model_validate({"model": v}),
    "retrieval knn stream": lambda v, _: KnnRetrieverSettings.model_validate({"kind": "knn", "stream": v}),
    "retrieval golden model": golden_probe,
    "index probe name": lambda v, tmp: index_probe(v, "m", tmp),
    "index probe model": lambda v, tmp: index_probe("p", v, tmp),
    "scaleout replica_id": lambda v, _: ScaleOutSettings.model_validate({"replica_id": v}),
    "drift pinned MODEL": pinned_reference,
    "drift pinned MODEL/STREAM": lambda v, tmp: pinned_reference(f"m/{v}", tmp),
    "canary model": lambda v, _: CanarySettings.model_validate({"ids": {v: ["a"]}}),
    "serving model": lambda v, _: EndpointSettings.model_validate({"model": v, "url": "http://127.0.0.1:1"}),
    "models": lambda v, _: Settings.model_validate({"models": {v: {"dim": 3}}}),
}


class _Labelled(BaseModel):
    value: LabelValue


def test_the_rule_itself() -> None:
    for value in REFUSED.values():
        assert not is_label_value(value)
        with pytest.raises(ValueError, match="is not a valid label value"):
            check_label_value(value)
        with pytest.raises(ValidationError):
            _Labelled(value=value)
    for value in ACCEPTED:
        assert is_label_value(value) and check_label_value(value) == value and _Labelled(value=value).value == value


@pytest.mark.parametrize("site", SITES)
def test_every_settings_site_refuses_what_the_rule_refuses(site: str, tmp_path: Path) -> None:
    build = SITES[site]
    for value in ACCEPTED:
        build(value, tmp_path)  # the site is reached: a valid value passes
    for what, value in REFUSED.items():
        with pytest.raises(ValidationError, match="label value|MODEL or MODEL/STREAM") as raised:
            build(value, tmp_path)
        assert repr(value)[1:-1] in str(raised.value), f"{site}: {what} not named"


def test_the_decoder_refuses_them_by_reason() -> None:
    decoder = Decoder(LimitSettings())
    for field in ("model", "stream"):
        for value in [*REFUSED.values(), 7]:
            event = {"id": "a", "model": "m", "vector": [0.5, 0.5], field: value}
            result = decoder.decode_embeddings([(orjson.dumps(event), ())])
            assert result.batches == [] or field == "stream"
            if field == "model":
                assert sum(n for (_, reason), n in result.rejected.items() if reason == "bad_label") == 1
    ok = decoder.decode_embeddings([(orjson.dumps({"id": "a", "model": "m" * 64, "vector": [0.5, 0.5]}), ())])
    assert [b.model for b in ok.batches] == ["m" * 64]
