"""What a repository-based system's checkout and weights folder must hold, checked without a GPU.

A system card may carry a ``layout`` section naming, relative to the checkout or the weights
folder, the files its driver imports or loads (``checkout``, ``submodules``, ``weights``,
``hub_copies``). :func:`layout_checks` reports each entry as (ok, plain-words detail); preflight
shows them, and checks a checkout's or weights folder's contents only when it exists.

The section's format: docs/repository-systems.md, "What the checkout and weights folder must hold".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicebias.io import resolve_path


def _hub_copy_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def layout_checks(name: str, card: dict[str, Any], params: dict[str, Any] | None, root: Path) -> list[tuple[bool, str]]:
    """(ok, detail) for every entry of the card's ``layout``, paths from params or the card's ``requires``."""
    layout = card.get("layout") or {}
    if not layout:
        return []
    params = params or {}
    req = card.get("requires") or {}
    upstream = (card.get("verified_against") or {}).get("repository", "the upstream repository")
    out: list[tuple[bool, str]] = []
    checkout_rel = params.get("checkout") or req.get("checkout")
    checkout = resolve_path(checkout_rel, root) if checkout_rel else None
    if checkout is not None and checkout.is_dir():
        for rel in layout.get("checkout") or []:
            ok = (checkout / rel).exists()
            out.append(
                (
                    ok,
                    f"{checkout_rel}/{rel} present"
                    if ok
                    else f"{checkout_rel}/{rel} is missing: the checkout does not have the layout of {upstream} that "
                    f"the driver imports from (see verified_against in models/cards/{name}.yaml)",
                )
            )
        for rel in layout.get("submodules") or []:
            folder = checkout / rel
            ok = folder.is_dir() and any(folder.iterdir())
            out.append(
                (
                    ok,
                    f"git submodule {checkout_rel}/{rel} checked out"
                    if ok
                    else f"{checkout_rel}/{rel} is {'empty' if folder.is_dir() else 'missing'}: the checkout lacks "
                    f"its git submodule {rel}. Run `git -C {checkout_rel} submodule update --init --recursive` "
                    "(or clone with --recurse-submodules)",
                )
            )
        for repo_id in layout.get("hub_copies") or []:
            local = checkout / repo_id
            ok = (local / "config.json").exists() or _hub_copy_cached(repo_id)
            out.append(
                (
                    ok,
                    f"{repo_id} available offline"
                    if ok
                    else f"{repo_id} is not available offline: {upstream} loads it by its hub id, which resolves to "
                    f"{checkout_rel}/{repo_id} (the worker runs in the checkout). Download it there: "
                    f"`huggingface-cli download {repo_id} --local-dir {checkout_rel}/{repo_id}`",
                )
            )
    weights_rel = params.get("weights") or req.get("weights")
    weights = resolve_path(weights_rel, root) if weights_rel else None
    if weights is not None and weights.is_dir():
        for rel in layout.get("weights") or []:
            ok = (weights / rel).exists()
            out.append(
                (
                    ok,
                    f"{weights_rel}/{rel} present"
                    if ok
                    else f"{weights_rel}/{rel} is missing (the weights layout is in models/cards/{name}.yaml)",
                )
            )
    return out
