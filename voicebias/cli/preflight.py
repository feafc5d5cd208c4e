"""Preflight: say in plain words what the active profile still needs on this machine.

Checks every component the profile names: TTS backend and its credentials,
classifier and embedding weights, each system's adapter, card, keys, GPU,
external checkout and weights. Keys are read from the environment or a .env
file at the repository root, and only their presence is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voicebias.config import ROOT
from voicebias.secrets import read_secret


@dataclass
class Check:
    component: str
    ok: bool
    detail: str


def gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _requirements(component: str, req: dict[str, Any], root: Path, has_gpu: bool) -> list[Check]:
    checks = []
    for var in req.get("env", []):
        present = read_secret(var, root) is not None
        checks.append(
            Check(
                component,
                present,
                f"environment variable {var} is {'set' if present else 'not set (put it in the environment or .env)'}",
            )
        )
    if req.get("gpu"):
        checks.append(
            Check(component, has_gpu, "CUDA GPU found" if has_gpu else "needs a CUDA GPU; none is visible to PyTorch")
        )
    for key, what in (("checkout", "external repository checkout"), ("weights", "model weights")):
        if req.get(key):
            path = root / req[key]
            checks.append(
                Check(component, path.exists(), f"{what} at {req[key]}" + ("" if path.exists() else " is missing"))
            )
    return checks


def preflight(params: dict[str, Any], root: Path = ROOT) -> list[Check]:
    from voicebias import tts
    from voicebias.cards import load_card
    from voicebias.instruments import classifiers
    from voicebias.instruments.judge import JUDGES
    from voicebias.stimuli.phonation import CONVERTERS
    from voicebias.systems.catalog import ADAPTERS, PLANNED_ADAPTERS

    has_gpu = gpu_available()
    checks: list[Check] = []
    backend = params["tts"]["backend"]
    if backend in tts.REGISTRY:
        checks.append(Check(f"tts:{backend}", True, "adapter available"))
    else:
        checks.append(
            Check(
                f"tts:{backend}", False, f"no adapter in this version ({tts.PLANNED.get(backend, 'unknown backend')})"
            )
        )
    checks += _requirements(f"tts:{backend}", params["tts"].get("requires", {}), root, has_gpu)
    names = params["acoustics"]["classifier"]
    for name in [names] if isinstance(names, str) else names:
        if name in classifiers.REGISTRY:
            checks.append(Check(f"classifier:{name}", True, "available offline"))
        else:
            checks.append(
                Check(
                    f"classifier:{name}",
                    False,
                    f"no backend in this version ({classifiers.PLANNED.get(name, 'unknown')})",
                )
            )
        weights = params["acoustics"].get("classifier_weights", {}).get(name)
        if weights:
            checks += _requirements(f"classifier:{name}", {"weights": weights}, root, has_gpu)
    emb = params["acoustics"].get("speaker_embedding_weights")
    if emb:
        checks += _requirements("speaker_embedding", {"weights": emb}, root, has_gpu)
    ph = params.get("phonation") or {}
    if ph["backend"] in CONVERTERS and CONVERTERS.meta(ph["backend"]).get("offline"):
        checks.append(Check(f"phonation:{ph['backend']}", True, "embedded converter available offline"))
    else:
        from voicebias.stimuli.phonation import vqvc

        try:
            cfg = vqvc.VQVCConfig.from_params(ph, root)
            for line in vqvc.setup_report(cfg):
                kind, _, detail = line.partition(": ")
                if kind != "note":
                    checks.append(Check("phonation:vqvc", kind == "ok", detail))
        except ValueError as exc:
            checks.append(Check("phonation:vqvc", False, str(exc)))
    judge = params.get("sc_judge") or {}
    jb = judge["backend"]
    meta = JUDGES.meta(jb) if jb in JUDGES else {}
    if meta.get("key_env"):
        checks += _requirements(f"sc_judge:{jb}", {"env": [judge["api_key_env"] or meta["key_env"]]}, root, has_gpu)
    elif meta.get("weights"):
        checks += _requirements(f"sc_judge:{jb}", {"weights": judge["weights"] or ""}, root, has_gpu)
    else:
        checks.append(Check(f"sc_judge:{jb}", True, "offline judge available"))
    for system in list(params["run"]["systems"]) + list(params["run"].get("sc_systems") or []):
        comp = f"system:{system}"
        try:
            card = load_card(system, root / "models" / "cards")
        except (FileNotFoundError, ValueError) as exc:
            checks.append(Check(comp, False, str(exc)))
            continue
        adapter = card["adapter"]
        if adapter in ADAPTERS:
            checks.append(Check(comp, True, f"adapter '{adapter}' available"))
        else:
            checks.append(
                Check(
                    comp,
                    False,
                    f"adapter '{adapter}' ({PLANNED_ADAPTERS.get(adapter, 'unknown')}) is not shipped in this version",
                )
            )
        if system not in params.get("systems", {}):
            checks.append(Check(comp, False, f"params.yaml has no systems.{system} section"))
        checks += _requirements(comp, card.get("requires", {}), root, has_gpu)
        from voicebias.systems.layout import layout_checks

        checks += [
            Check(comp, ok, detail)
            for ok, detail in layout_checks(system, card, (params.get("systems") or {}).get(system), root)
        ]
    return checks


def format_checks(checks: list[Check]) -> str:
    missing = [c for c in checks if not c.ok]
    lines = [f"  {'ok     ' if c.ok else 'MISSING'}  {c.component}: {c.detail}" for c in checks]
    head = (
        "Ready: everything this profile needs is here."
        if not missing
        else f"Not ready: {len(missing)} thing(s) missing for this profile."
    )
    return "\n".join([head, *lines])
