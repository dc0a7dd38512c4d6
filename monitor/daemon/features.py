"""Which components the daemon runs, from the settings.

Feature packages (drift, retrieval probes) add their factory here; the daemon itself never
imports them, so a feature that is switched off costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from monitor.component import Component, MonitorContext

if TYPE_CHECKING:
    from monitor.canary.component import CanaryComponent
    from monitor.config import Settings

ComponentFactory = Callable[[MonitorContext], Component]


def default_component_factories(settings: Settings, canary_class: type[CanaryComponent] | None = None,
                                ) -> list[ComponentFactory]:
    """Factories for every component the settings enable, in the order hooks should run;
    ``canary_class``: the role's canary component (default :class:`CanaryComponent`)."""
    factories: list[ComponentFactory] = []
    if settings.drift.enabled:
        from monitor.drift.component import DriftComponent

        factories.append(DriftComponent)
    if settings.serving.enabled:  # the canary component too: the serving probe's vectors are canaries
        from monitor.serving.component import serving_factories

        factories.extend(serving_factories(canary_class) if canary_class is not None else serving_factories())
    elif settings.canaries.enabled:
        from monitor.canary.component import CanaryComponent

        factories.append(canary_class or CanaryComponent)
    if settings.probes.enabled:
        from monitor.retrieval.probes.component import ProbeComponent

        factories.append(ProbeComponent)
    if settings.index.enabled:
        from monitor.index.component import IndexComponent

        factories.append(IndexComponent)
    return factories
