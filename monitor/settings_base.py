"""What every settings section shares (light: pydantic only).

* unknown keys are errors (a typo is not silently ignored);
* no float setting takes ``inf``, ``-inf`` or ``nan``: ``window.seconds: .inf`` once ran a daemon
  that was healthy and ready and counted nothing;
* every duration (a float field named ``*seconds``) has an upper bound of at most
  :data:`MAX_DURATION_SECONDS`, so an absurd value (``1e300``) is refused at start instead of
  overflowing a timer later. tests/package/test_config.py walks the settings tree to hold every
  section, present and future, to both rules.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_DURATION_SECONDS = 30 * 86_400  # 30 days: longer windows, periods and timeouts are typos


class Section(BaseModel):
    """A settings section: unknown keys and non-finite numbers are errors; assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
