"""The one-to-one ``{source: destination}`` mappings of a migration rewrite
(mdev UUIDs, VF PCI addresses): canonical keys and values, refused when a
source is given twice with different destinations or two sources share one."""

from __future__ import annotations

from collections.abc import Callable, Mapping


def canonical_one_to_one(
    mapping: Mapping[str, str],
    canonical: Callable[[str, str], str],
    mapped_twice: Callable[[str, str], Exception],
    shared_target: Callable[[str, str], Exception],
) -> dict[str, str]:
    """``canonical(value, where)`` validates and canonicalises one side;
    ``mapped_twice(source, reason)`` and ``shared_target(target, sources)``
    build the refusals."""
    result: dict[str, str] = {}
    for source, target in mapping.items():
        key = canonical(source, " (mapping source)")
        value = canonical(target, f" (mapping destination for {source})")
        previous = result.get(key)
        if previous is not None and previous != value:
            raise mapped_twice(source, f"mapped twice, to {previous} and to {value}")
        result[key] = value
    sources_of: dict[str, list[str]] = {}
    for key, value in result.items():
        sources_of.setdefault(value, []).append(key)
    for target, sources in sources_of.items():
        if len(sources) > 1:
            raise shared_target(target, " and ".join(sources))
    return result
