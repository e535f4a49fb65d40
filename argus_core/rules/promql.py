"""Small PromQL builders shared by the recording and alerting rules (selectors, phase kinds)."""

from __future__ import annotations

from argus_core.schema import AXES
from argus_core.taxonomy import _COMM_WORDS, POINT_TO_POINT_OPS

# A phase is communication when it is axis-prefixed (``dp-allreduce``) or named after a
# collective: the same test as argus_core.taxonomy.is_comm_phase, as one RE2 regex (PromQL
# anchors it; backtick strings keep the backslashes of \b).
COMM_PHASE_REGEX = f"({'|'.join(AXES)})-.*|(?i:.*({_COMM_WORDS.pattern}).*)"


def select(metric: str, *matchers: str) -> str:
    """``metric{m1,m2,...}`` leaving out empty matchers."""
    inner = ",".join(m for m in matchers if m)
    return f"{metric}{{{inner}}}" if inner else metric


def compute_phases() -> str:
    """Matcher for compute phases (everything that is not communication)."""
    return f"phase!~`{COMM_PHASE_REGEX}`"


def axis_phases(axis: str) -> str:
    """Matcher for the collectives of one axis (``dp-...``): their group is the axis group."""
    return f'phase=~"{axis}-.*"'


def all_axis_phases() -> str:
    """Matcher for every axis's collectives (``{axis}-...``)."""
    return f'phase=~"({"|".join(AXES)})-.*"'


def not_point_to_point() -> str:
    """Matcher leaving out send and recv phases (``pp-send``): L2 never compares them along
    their axis (argus_core.taxonomy.is_point_to_point)."""
    return f'phase!~".*-({"|".join(sorted(POINT_TO_POINT_OPS))})"'


def other_axes(axis: str) -> list[str]:
    """The coordinates that define an ``axis`` group: all axes but ``axis``."""
    return [a for a in AXES if a != axis]


def group_labels(axis: str, *extra: str) -> str:
    """``job, phase, <other axes>``: the labels that identify a rank's ``axis`` group."""
    return ", ".join(["job", *extra, *other_axes(axis)])


def indent(text: str) -> str:
    """``text`` with every line indented by two spaces (nested PromQL stays readable)."""
    return "\n".join("  " + line for line in text.splitlines())
