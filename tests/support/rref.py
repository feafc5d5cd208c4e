"""R as an independent reference at test time (never a runtime dependency of voicebias).

`run_r(code, **tables)` writes each DataFrame to a CSV, runs `Rscript` on a script that
reads them into R data frames of the same names, and returns what the script printed
with `emit(name, value)`: a dict of name -> float or list of floats (NA as None, +-Inf as
+-inf). A missing R fails
the test (CI installs it from Debian packages in .ci/run); it never skips.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

_PRELUDE = r"""
options(digits = 17, warn = 1)
.emitted <- list()
emit <- function(name, value) { .emitted[[name]] <<- as.numeric(value) }
"""

_EPILOGUE = r"""
.out <- vapply(names(.emitted), function(n) {
  v <- .emitted[[n]]
  txt <- ifelse(is.na(v), "null", ifelse(is.infinite(v), ifelse(v > 0, "Infinity", "-Infinity"), sprintf("%.17g", v)))
  paste0('"', n, '": [', paste(txt, collapse = ","), "]")
}, "")
cat("@@RREF@@{", paste(.out, collapse = ","), "}\n", sep = "")
"""


def rscript() -> str:
    path = shutil.which("Rscript")
    if path is None:
        raise RuntimeError(
            "Rscript not found: the statistics reference tests need R "
            "(apt-get install r-base-core r-cran-lme4 r-cran-lmertest r-cran-emmeans r-cran-car r-cran-brglm2)"
        )
    return path


def run_r(code: str, timeout: float = 300, **tables: pd.DataFrame) -> dict[str, float | list[float]]:
    """Run R `code` with each keyword DataFrame loaded under its name; return what it emit()ted.

    Character columns arrive as character vectors (use factor(..., levels=...) in R when the
    level order matters); single values come back as floats, longer vectors as lists.
    """
    with tempfile.TemporaryDirectory(prefix="rref-") as tmp:
        loads = []
        for name, df in tables.items():
            p = Path(tmp) / f"{name}.csv"
            df.to_csv(p, index=False)
            loads.append(f'{name} <- read.csv("{p.as_posix()}", stringsAsFactors = FALSE)')
        script = Path(tmp) / "ref.R"
        script.write_text(_PRELUDE + "\n".join(loads) + "\n" + code + "\n" + _EPILOGUE, encoding="utf-8")
        proc = subprocess.run([rscript(), "--vanilla", str(script)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"R failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@RREF@@")), None)
    if line is None:
        raise RuntimeError(f"R printed no results:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    raw = json.loads(line[len("@@RREF@@") :])
    return {k: (v[0] if len(v) == 1 else v) for k, v in raw.items()}
