"""Stage report: render reports/report/{report.md,report.html} and figures from the analysis tables."""

from voicebias import config
from voicebias.errors import guarded, stage_params
from voicebias.pipeline.report import run_stage

if __name__ == "__main__":
    guarded(run_stage, stage_params("report"), config.REPORTS / "analysis", config.REPORTS / "carrier_gate",
            config.REPORTS / "bank" / "metrics.json", config.REPORTS / "report",
            config.REPORTS / "sc", config.REPORTS / "phonation", stage="report")
