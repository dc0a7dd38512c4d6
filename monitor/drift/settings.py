"""Drift settings (nested as ``drift:`` in the daemon's Settings): the library's and the daemon's.

One knob sets how often the operator accepts a false drift alarm (``false_alarm_every``);
``evidence_share`` of that budget goes to the accumulating detector (its threshold
``evidence_threshold``), the rest to the per-window suite, whose per-cycle and per-test p-value
thresholds, and how many permutations the permutation tests need to be able to reach them,
follow from it (see :mod:`monitor.drift.twosample.calibration`). Where that is
more than ``max_permutations`` (short cycles: 5 s with one false alarm a month needs two
million), the MMD test uses its held-out null instead (:mod:`monitor.drift.twosample.heldout`)
and the centroid test its analytic one (:mod:`monitor.drift.twosample.quadratic_null`), which
reach any alpha. A setting that would make a test unable to ever detect is
rejected here, at start-up, with a message saying what to change.

Examples
--------
>>> s = DriftSettings(interval_seconds=3600, false_alarm_every="30d")
>>> s.enabled_tests
('mmd', 'ks', 'centroid', 'classifier')
>>> s.evidence_threshold  # half the budget (evidence_share) to the accumulating detector: A = 1 / (0.5 x 1h / 30d)
1440.0
>>> round(s.cycle_alpha, 6), round(s.test_alpha, 7)  # the other half to the suite, a quarter to each test
(0.000694, 0.0001736)
>>> s.permutations_for("mmd"), s.null_for("mmd")
(5760, 'permutation')
>>> w = DriftSettings(interval_seconds=3600, false_alarm_every="30d", centroid={"weight": 6})  # 6 of 9
>>> round(w.alpha_for("centroid") / w.cycle_alpha, 4), w.permutations_for("centroid"), w.permutations_for("mmd")
(0.6667, 2160, 12960)
>>> fast = DriftSettings(interval_seconds=5, false_alarm_every="30d")  # alpha per test 2.4e-7
>>> fast.null_for("mmd"), fast.null_for("centroid")  # two million permutations: out of reach
('heldout', 'analytic')

:class:`DriftSettings` is everything the drift library needs; :class:`DaemonDriftSettings` (what
the daemon's ``Settings.drift`` holds) adds per-(model, stream) reference pins and the ``run``
flags that set them. Light on purpose (pydantic and the standard library), so loading settings
stays fast.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, overload

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from monitor.decoding.labels import is_label_value
from monitor.drift.online.detector_kinds import (
    DEFAULT_DETECTOR_PARAMS,
    DEFAULT_DETECTORS,
    SIGNALS,
    DetectorKind,
    check_detector_params,
)
from monitor.drift.twosample.calibration import (
    Multiplicity,
    cycle_alpha,
    cycle_alpha_for_sustained,
    largest_passing,
    parse_duration,
    per_test_alpha,
    permutations_needed,
)
from monitor.settings_base import MAX_DURATION_SECONDS
from monitor.settings_base import Section as _Section

TEST_NAMES = ("mmd", "ks", "centroid", "classifier")
PERMUTATION_TESTS = ("mmd", "centroid")
NullChoice = Literal["auto", "permutation", "heldout"]
CentroidNullChoice = Literal["auto", "permutation", "heldout", "analytic"]
_NULL_HELP = (
    "auto: permutations when the per-test alpha needs at most max_permutations of them (or when "
    "permutations is set), else the held-out rank test; permutation; heldout"
)
_CENTROID_NULL_HELP = (
    "auto: permutations when the per-test alpha needs at most max_permutations of them (or when "
    "permutations is set), else the analytic null of the squared mean distance; permutation; heldout; analytic"
)
REFERENCE_SUFFIXES = (".npz", ".npy")
MIN_WEIGHT, MAX_WEIGHT = 0.001, 1000.0  # a million to one at most: no test's alpha underflows
_WEIGHT_HELP = (
    "this test's share of the suite's false-alarm budget, relative to the other enabled tests' weights "
    "(weighted Holm; docs/drift.md, 'How the budget is shared')"
)
# centroid.weight auto where the centroid's null is analytic and the MMD's held out: measured in
# bench.detection (docs/drift.md, "How the budget is shared"); 1 where both run permutations
ANALYTIC_CENTROID_WEIGHT = 6.0
_CENTROID_WEIGHT_HELP = (
    f"as the other tests' weight; auto: {ANALYTIC_CENTROID_WEIGHT:g} where, at an equal share, the centroid's "
    "null is analytic and the MMD's held out (short cycles, long budgets), else 1"
)
Weight = Annotated[float, Field(ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)]
_WEIGHT: TypeAdapter[float] = TypeAdapter(Weight)


class MMDSettings(_Section):
    """Kernel two-sample test (:mod:`monitor.drift.twosample.mmd`)."""

    enabled: bool = True
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, description=_WEIGHT_HELP)
    null: NullChoice = Field("auto", description=_NULL_HELP)
    permutations: int | None = Field(
        None, ge=1, le=1_000_000,
        description="permutation budget; None = the fewest that can reach the per-test alpha (at least 200)",
    )
    stop_after: int | None = Field(10, ge=1, description="sequential stop after this many exceedances; None = never")
    bandwidth: float | None = Field(None, gt=0, description="RBF bandwidth; None = median heuristic")
    block_size: int = Field(1024, ge=64, le=8192, description="kernel tile side; memory ~ 12 * block_size**2 bytes")


class KSSettings(_Section):
    """Per-component Kolmogorov–Smirnov tests with Benjamini–Hochberg (:mod:`monitor.drift.twosample.ks`)."""

    enabled: bool = True
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, description=_WEIGHT_HELP)
    basis: Literal["pca_pooled", "pca_reference", "raw"] = "pca_pooled"
    components: int = Field(50, ge=1, le=4096)


class CentroidSettings(_Section):
    """Cosine distance between the means (:mod:`monitor.drift.twosample.centroid`)."""

    enabled: bool = True
    weight: Weight | Literal["auto"] = Field("auto", description=_CENTROID_WEIGHT_HELP)
    null: CentroidNullChoice = Field("auto", description=_CENTROID_NULL_HELP)
    permutations: int | None = Field(None, ge=1, le=1_000_000)
    stop_after: int | None = Field(10, ge=1)

    @field_validator("weight", mode="before")
    @classmethod
    def _auto_or_a_weight(cls, value: Any) -> float | str:
        """One message for a bad weight (not one per member of the union)."""
        if isinstance(value, str) and value == "auto":
            return value
        try:
            return _WEIGHT.validate_python(value)
        except ValidationError as error:
            raise ValueError(f"{error.errors()[0]['msg']} (or 'auto')") from None


class ClassifierSettings(_Section):
    """Domain-classifier AUC test (:mod:`monitor.drift.twosample.classifier`)."""

    enabled: bool = True
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, description=_WEIGHT_HELP)
    train_fraction: float = Field(0.5, gt=0, lt=1)
    regularization: float = Field(0.1, gt=0, description="scikit-learn C (smaller is stronger)")
    squared_components: int = Field(16, ge=0, le=256)
    max_iter: int = Field(500, ge=10, le=100_000)


class RegionSettings(_Section):
    """What moved: a k-means partition of the reference and each cycle's share test.

    See :mod:`monitor.drift.attribution.regions`.
    """

    enabled: bool = True
    max_regions: int = Field(
        32, ge=2, le=64,
        description="k is min(this, held-out reference rows / 50): 32 for the default 4,000-row stored sample; "
        "more regions name a narrower topic (docs/drift.md, 'What moved'), each adds 3 series per stream",
    )
    exemplars: int = Field(3, ge=0, le=10, description="ids shown per region: the window rows that moved it most "
                           "(ranked by a local witness, docs/drift.md 'What moved')")
    fdr_q: float = Field(
        0.05, gt=0, lt=1,
        description="explanation false discovery rate: once the suite rejected, regions and the novel share are "
        "named by Benjamini-Hochberg at this level (docs/drift.md, 'What moved'); without a verdict nothing is named",
    )


class OnlineSettings(_Section):
    """river detectors on per-record signals, fed on the ingest thread (:mod:`monitor.drift.online.detectors`).

    Parameter names are checked here; their values when the drift component builds the detectors
    at start-up (river's constructors check them), so loading settings never imports river.
    """

    enabled: bool = True
    signals: list[Literal["cosine", "norm"]] = Field(default_factory=lambda: list(SIGNALS), min_length=1)
    aggregate: int = Field(64, ge=1, le=1_000_000, description="records per detector update (mini-batch mean)")
    detectors: dict[DetectorKind, dict[str, Any]] = Field(
        default_factory=lambda: {kind: dict(DEFAULT_DETECTOR_PARAMS[kind]) for kind in DEFAULT_DETECTORS},
        min_length=1,
    )

    @field_validator("detectors")
    @classmethod
    def _check_detectors(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for kind, params in value.items():
            check_detector_params(kind, params)
        return value


class ReferenceSettings(_Section):
    """Where the reference sample comes from.

    ``path`` (a pinned reference, an ``.npz`` written by ``ReferenceProfile.to_npz``) wins; else
    ``lagged_seconds`` compares each window with the window that far in the past; else the first
    ``records`` records of each (model, stream) form the reference.
    """

    records: int = Field(5000, ge=100, le=10_000_000, description="first N records form the reference")
    path: Path | None = None
    lagged_seconds: float | None = Field(None, gt=0, le=MAX_DURATION_SECONDS)

    @property
    def mode(self) -> Literal["pinned", "lagged", "first_records"]:
        return "pinned" if self.path is not None else self.fallback_mode

    @property
    def fallback_mode(self) -> Literal["lagged", "first_records"]:
        """What a (model, stream) that no pinned file applies to uses."""
        return "lagged" if self.lagged_seconds is not None else "first_records"


class SustainedSettings(_Section):
    """The alert rule's "drift in at least ``detections`` of the last ``cycles`` cycles".

    Must match the alert rule: ``false_alarm_every`` then budgets the alerts a person sees, and the
    per-cycle alpha is raised accordingly (1 of 1: every cycle's verdict is an alert).
    """

    detections: int = Field(1, ge=1, le=100)
    cycles: int = Field(1, ge=1, le=100)

    @model_validator(mode="after")
    def _check_order(self) -> SustainedSettings:
        if self.detections > self.cycles:
            raise ValueError(f"detections ({self.detections}) cannot exceed cycles ({self.cycles})")
        return self


class DriftSettings(_Section):
    """Everything drift: the scheduled two-sample tests, their calibration, the online detectors."""

    enabled: bool = True
    interval_seconds: float = Field(
        900.0, gt=0, le=MAX_DURATION_SECONDS, description="test cycle: how often the two-sample tests run"
    )
    false_alarm_every: str = Field("30d", description="accepted mean time between false drift alarms, e.g. '30d'")
    multiplicity: Multiplicity = "holm"
    window_sample_size: int = Field(2000, ge=20, le=100_000, description="rows of the window sample per cycle")
    reference_sample_size: int = Field(2000, ge=20, le=100_000, description="rows of the reference sample")
    min_permutations: int = Field(200, ge=1, le=1_000_000)
    max_permutations: int = Field(
        20_000, ge=1, le=1_000_000,
        description="null: auto uses the held-out null where the per-test alpha needs more permutations",
    )
    cycle_budget: float = Field(
        0.8, gt=0, le=1,
        description="share of interval_seconds a cycle may take; no test starts, no permutation is drawn after it",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the drift tests run: the daemon's device rule (monitor/devices.py)"
    )
    threads: int | None = Field(
        None, ge=1, le=1024,
        description="cap BLAS/OpenMP/torch threads while a cycle runs; None = library defaults",
    )
    seed: int = 0
    screen_level: float = Field(
        0.01, gt=0, le=1,
        description="the staged cycle: the costly tests (classifier, MMD) run only when a cheap one (KS, centroid, "
        "the location and scale screens) has a p-value at most this (at least 100 per-test alphas); 1 runs every "
        "test every cycle (docs/drift.md, 'The staged cycle')",
    )
    evidence_share: float = Field(
        0.5, ge=0, lt=1,
        description="share of the false-alarm budget spent on the accumulating detector (docs/drift.md, 'Evidence "
        "that accumulates'); the suite decides at the rest; 0 turns the detector off and gives the suite all of it",
    )
    evidence_rows: int = Field(
        10_000, ge=1, le=1_000_000,
        description="fresh rows the accumulating detector bets on per cycle: the first this many to arrive "
        "(each labelled on the ingest thread); later rows of the cycle are not labelled",
    )
    mmd: MMDSettings = Field(default_factory=MMDSettings)
    ks: KSSettings = Field(default_factory=KSSettings)
    centroid: CentroidSettings = Field(default_factory=CentroidSettings)
    classifier: ClassifierSettings = Field(default_factory=ClassifierSettings)
    regions: RegionSettings = Field(default_factory=RegionSettings)
    online: OnlineSettings = Field(default_factory=OnlineSettings)
    reference: ReferenceSettings = Field(default_factory=ReferenceSettings)
    sustained: SustainedSettings = Field(default_factory=SustainedSettings)

    @field_validator("false_alarm_every")
    @classmethod
    def _check_duration(cls, value: str) -> str:
        parse_duration(value)
        return value.strip()

    @model_validator(mode="after")
    def _check_calibration(self) -> DriftSettings:
        if not self.enabled:
            return self
        if not self.enabled_tests:
            raise ValueError("drift is enabled but every test is disabled; enable one or set drift.enabled: false")
        every = parse_duration(self.false_alarm_every)
        if every <= self.interval_seconds:
            raise ValueError(
                f"false_alarm_every ({self.false_alarm_every}) must be longer than interval_seconds "
                f"({self.interval_seconds:g}s)"
            )
        for name in PERMUTATION_TESTS:
            section = getattr(self, name)
            if not section.enabled:
                continue
            needed = permutations_needed(self.alpha_for(name))
            budget = self.permutations_for(name)  # type: ignore[arg-type]
            if self.null_for(name) == "permutation" and budget < needed:  # type: ignore[call-overload]
                raise ValueError(
                    f"{name}.permutations={budget} can never detect: its alpha is "
                    f"{self.alpha_for(name):.3g} and the smallest p-value is 1/(1 + permutations). Use at least "
                    f"{needed}, give {name} more of the budget ({name}.weight, or less to the others), "
                    f"leave it unset with null: auto (a null without permutations where they are out "
                    f"of reach), set {name}.null: {'analytic' if name == 'centroid' else 'heldout'}, lengthen "
                    f"interval_seconds, shorten false_alarm_every, or alert on a sustained rule "
                    f"(sustained.detections/cycles)"
                )
        return self

    @property
    def false_alarm_every_seconds(self) -> float:
        return parse_duration(self.false_alarm_every)

    @property
    def enabled_tests(self) -> tuple[str, ...]:
        return tuple(name for name in TEST_NAMES if getattr(self, name).enabled)

    @property
    def evidence_active(self) -> bool:
        """Whether the accumulating detector takes part of the budget: it bets on the reference's
        regions, so it needs them, and a fixed reference (a lagged one changes every cycle)."""
        return (
            self.enabled and self.evidence_share > 0 and self.regions.enabled and self.reference.mode != "lagged"
        )

    @property
    def evidence_threshold(self) -> float | None:
        """The detector's alarm threshold A = 1 / (s · interval / false_alarm_every); None when it is off."""
        if not self.evidence_active:
            return None
        # monitor.drift.online.evidence.threshold_for, without importing numpy into the settings
        return 1.0 / (self.evidence_share * cycle_alpha(self.interval_seconds, self.false_alarm_every_seconds))

    @property
    def cycle_alpha(self) -> float:
        """Per-cycle false-alarm probability of the suite: with the accumulating detector's
        alarms (at most ``evidence_share`` of the budget), alerts come every ``false_alarm_every`` on average.

        The suite's alerts get ``1 - evidence_share`` of the alert rate: as if ``false_alarm_every``
        were ``false_alarm_every / (1 - evidence_share)``.
        """
        every = self.false_alarm_every_seconds / (1.0 - self.evidence_share if self.evidence_active else 1.0)
        if self.sustained.cycles == 1:
            return cycle_alpha(self.interval_seconds, every)
        return cycle_alpha_for_sustained(self.interval_seconds, every, self.sustained.detections, self.sustained.cycles)

    @property
    def test_weights(self) -> dict[str, float]:
        """The enabled tests' weights (``<test>.weight``, ``auto`` resolved): their shares of the suite's budget.

        ``centroid.weight: auto`` is :data:`ANALYTIC_CENTROID_WEIGHT` where, at an equal share, the
        centroid's null is analytic (it uses every row) and the MMD's is held out (it tests on half
        of its rows); else 1:

        >>> DriftSettings(interval_seconds=60, false_alarm_every="30d").test_weights["centroid"]
        6.0
        >>> DriftSettings(interval_seconds=3600, false_alarm_every="30d").test_weights["centroid"]  # permutations
        1.0
        """
        weights = {}
        for name in self.enabled_tests:
            weight = getattr(self, name).weight
            if weight == "auto":
                weight = ANALYTIC_CENTROID_WEIGHT if self._centroid_weighted else 1.0
            weights[name] = float(weight)
        return weights

    @property
    def _centroid_weighted(self) -> bool:
        """Whether ``centroid.weight: auto`` is :data:`ANALYTIC_CENTROID_WEIGHT`: at an equal share the
        centroid's null is analytic and the enabled MMD's held out. Both nulls are then out of
        the weights' reach (neither runs permutations), so the weight moves no test's null."""
        return ("mmd" in self.enabled_tests and self._null_at_equal_share("centroid") == "analytic"
                and self._null_at_equal_share("mmd") == "heldout")

    def alpha_for(self, test: str) -> float:
        """A test's own threshold in the cycle (weighted Bonferroni; weighted Holm's first step):
        ``cycle_alpha · w_test / Σ w``, the sum over the enabled tests. An equal split when every
        weight is the same.

        >>> s = DriftSettings(interval_seconds=60, false_alarm_every="7d", evidence_share=0, centroid={"weight": 6})
        >>> round(s.alpha_for("centroid") / s.cycle_alpha, 4), round(s.alpha_for("mmd") / s.cycle_alpha, 4)
        (0.6667, 0.1111)
        """
        weights = self.test_weights
        if test not in weights:
            raise ValueError(f"{test} is not an enabled drift test ({', '.join(weights) or 'none is'})")
        if len(set(weights.values())) == 1:  # equal weights: alpha / k, as before the weights
            return per_test_alpha(self.cycle_alpha, len(weights))
        # weighted: the largest p-value weighted Holm's first step passes (its own arithmetic)
        return largest_passing(self.cycle_alpha, math.fsum(weights.values()), weights[test])

    @property
    def test_alpha(self) -> float:
        """The strictest per-test threshold: the smallest :meth:`alpha_for` (weighted Holm's first step)."""
        weights = self.test_weights
        if not weights:
            return per_test_alpha(self.cycle_alpha, 1)
        return min(self.alpha_for(name) for name in weights)

    def _permutations_to_reach(self, alpha: float) -> int:
        return max(self.min_permutations, permutations_needed(alpha))

    def permutations_for(self, test: Literal["mmd", "centroid"]) -> int:
        """The permutation budget of a permutation test: as configured, or enough to reach its alpha."""
        configured = getattr(self, test).permutations
        if configured is not None:
            return configured
        alpha = self.alpha_for(test) if test in self.enabled_tests else self.test_alpha
        return self._permutations_to_reach(alpha)

    @overload
    def null_for(self, test: Literal["mmd"]) -> Literal["permutation", "heldout"]: ...
    @overload
    def null_for(self, test: Literal["centroid"]) -> Literal["permutation", "heldout", "analytic"]: ...
    @overload
    def null_for(self, test: Literal["mmd", "centroid"]) -> Literal["permutation", "heldout", "analytic"]: ...

    def null_for(self, test: Literal["mmd", "centroid"]) -> Literal["permutation", "heldout", "analytic"]:
        """The null distribution the MMD or centroid test uses (``null: auto`` resolved).

        ``auto`` keeps the permutation test (exact) while the per-test alpha needs at most
        ``max_permutations`` relabellings, or when ``permutations`` is set explicitly; beyond, a null
        that reaches any alpha without permutations: MMD's held-out rank test, and the centroid's
        analytic null, which uses every row (the held-out one fits on half and tests on half: at a
        false alarm a week it detected a 20 % share rise in 10 of 64 windows, the analytic one in 37).
        """
        section = getattr(self, test)
        at_equal = self._null_at_equal_share(test)
        if section.null != "auto" or section.permutations is not None or at_equal != "permutation":
            return at_equal
        # A weight can move a test to the null without permutations (its alpha is smaller than an
        # equal share's), never to permutations: the equal share decides too, so a larger weight
        # does not trade the centroid's analytic null (0.3 ms) for thousands of relabellings.
        if self.permutations_for(test) <= self.max_permutations:
            return "permutation"
        return "analytic" if test == "centroid" else "heldout"

    def _null_at_equal_share(self, test: Literal["mmd", "centroid"]) -> Literal["permutation", "heldout", "analytic"]:
        """:meth:`null_for` were every enabled test's weight the same (what ``centroid.weight: auto`` reads)."""
        section = getattr(self, test)
        if section.null != "auto":
            return section.null
        equal = per_test_alpha(self.cycle_alpha, max(1, len(self.enabled_tests)))
        if section.permutations is not None or self._permutations_to_reach(equal) <= self.max_permutations:
            return "permutation"
        return "analytic" if test == "centroid" else "heldout"

# ---------------------------------------------------------------------------------- the daemon's
def _is_target(target: str) -> bool:
    """Whether a pin's key is MODEL or MODEL/STREAM: one label value, or two joined by a ``/``.

    >>> _is_target("minilm"), _is_target("minilm/queries"), _is_target("m" * 64 + "/" + "s" * 64)
    (True, True, True)
    >>> _is_target("minilm\\n"), _is_target("/minilm"), _is_target("m" * 65), _is_target("m\\x00/s")
    (False, False, False, False)
    """
    if target.startswith("/") or target.endswith("/"):
        return False
    return is_label_value(target) or any(
        is_label_value(target[:i]) and is_label_value(target[i + 1:]) for i, c in enumerate(target) if c == "/"
    )


def _check_reference_file(path: Path, what: str) -> Path:
    if Path(path).suffix not in REFERENCE_SUFFIXES:
        raise ValueError(f"{what}: {str(path)!r} must be an .npz reference or an .npy (n, d) matrix")
    if not Path(path).is_file():
        raise ValueError(f"{what}: file {str(path)!r} does not exist")
    return path


class DaemonReferenceSettings(ReferenceSettings):
    """``drift.reference`` in the daemon: the library's settings plus per-(model, stream) pins.

    ``path`` applies to every (model, stream) whose dimension matches the file; ``pinned`` maps
    ``MODEL`` (all its streams) or ``MODEL/STREAM`` to a file and wins over ``path``. Streams no
    pin applies to use ``lagged_seconds`` when set, else the first ``records`` records.
    """

    pinned: dict[str, Path] = Field(
        default_factory=dict, description="MODEL or MODEL/STREAM -> .npz/.npy reference file"
    )

    @field_validator("pinned")
    @classmethod
    def _check_pinned(cls, value: dict[str, Path]) -> dict[str, Path]:
        for target, path in value.items():
            if not _is_target(target):
                raise ValueError(f"{target!r} is not MODEL or MODEL/STREAM")
            _check_reference_file(path, f"pinned[{target}]")
        return value

    @model_validator(mode="after")
    def _check_path(self) -> DaemonReferenceSettings:
        if self.path is not None:
            _check_reference_file(self.path, "path")
        return self


class DaemonDriftSettings(DriftSettings):
    """``drift:`` in the daemon's settings (the library's :class:`DriftSettings`, daemon references)."""

    reference: DaemonReferenceSettings = Field(default_factory=DaemonReferenceSettings)

    @model_validator(mode="before")
    @classmethod
    def _from_library_settings(cls, value: Any) -> Any:
        """Accept the library's own ``DriftSettings`` (e.g. ``Settings(drift=DriftSettings(...))``)."""
        if isinstance(value, DriftSettings) and not isinstance(value, cls):
            return value.model_dump()
        return value


def parse_reference_flag(text: str) -> tuple[str | None, str]:
    """``--reference`` → (target, file): ``FILE`` or ``*=FILE`` is for every stream, else ``MODEL[/STREAM]=FILE``.

    Model and stream names cannot contain ``=``, so the first ``=`` separates the target.

    >>> parse_reference_flag("ref.npz")
    (None, 'ref.npz')
    >>> parse_reference_flag("minilm/queries=/refs/q.npy")
    ('minilm/queries', '/refs/q.npy')
    """
    target, sep, path = text.partition("=")
    if not sep:
        return None, text
    if not path:
        raise ValueError(f"--reference {text!r}: the file is missing after '='")
    return (None if target == "*" else target), path


def reference_overrides(flags: list[str] | None, records: int | None) -> dict[str, Any]:
    """The ``drift.reference`` overrides for ``--reference`` (repeatable) and ``--reference-records``."""
    out: dict[str, Any] = {}
    pinned: dict[str, str] = {}
    for text in flags or []:
        target, path = parse_reference_flag(text)
        if target is None:
            if "path" in out:
                raise ValueError(
                    "--reference FILE (for every stream) was given twice; target the others with MODEL[/STREAM]=FILE"
                )
            out["path"] = path
        else:
            pinned[target] = path
    if pinned:
        out["pinned"] = pinned
    if records is not None:
        out["records"] = records
    return out
