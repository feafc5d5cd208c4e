"""The project's vocabulary: the values the tables hold, the names of the measures and
the columns of every table one stage hands to another.

Modules take these from here rather than spelling them again, so a table written by
one stage reads the same in the next. Values (languages, poles, genders, conditions)
are data: they appear in the tables and in params.yaml as written here. Measure names
carry their units (`_db`, `_hz`, `_st` semitones re 100 Hz, `_oct` octaves, `_s`),
one spelling per measure in every table and report.

Nothing here imports anything: every module can take its vocabulary from it.
"""

from __future__ import annotations

# ------------------------------------------------------------------ values

#: languages of the passage bank, the stimuli and the tasks
LANGUAGES = ("en", "es", "zh")
#: stereotype pole of a passage's content (S2S paper, sec. 3.2)
POLES = ("masculine", "neutral", "feminine")
#: content step of each pole: the odds ratio's and the planted systems' coding (masculine 0 .. feminine 2)
POLE_ORDINAL = {"masculine": 0, "neutral": 1, "feminine": 2}
#: gender of a stimulus voice (and of a judged or planted answer)
GENDERS = ("male", "female")
#: phonation conditions of the speech-continuation (SC) stimuli; 'modal' is the unmodified voice
CONDITIONS = ("modal", "breathy", "creaky", "endcreak")
#: SC prompt sets: NOP_set starters and the Spoken StereoSet gender subset
PROMPT_SETS = ("nop", "ss")
#: status of one system call in the responses and continuations tables: ok, failed (the call did not
#: return a reply), excluded (a reply that cannot be analysed; its code in `reason`, REPLY_REASONS)
RESPONSE_STATUSES = ("ok", "failed", "excluded")
#: why a reply is excluded (voicebias.systems.screen): no speech, a refusal, or audio the instrument refuses
#: (the last group are voicebias.audio's refusal codes)
REPLY_REASONS = (
    "no_audio",
    "empty_audio",
    "refusal",
    "too_short",
    "too_long",
    "silent",
    "clipped",
    "low_sample_rate",
    "truncated",
    "not_audio",
    "nan",
    "stereo_cancels",
)
#: reason of a responses row whose call failed (asked again on the next run), and of one whose
#: audio came without a transcript where no ASR is configured
CALL_FAILED = "call_failed"
NO_TRANSCRIPT = "no_transcript"
#: planted misbehaviour of a reference system (params.yaml systems.<name>.faults; voicebias.systems.reference)
FAULTS = (
    "refusal",
    "no_audio",
    "empty_audio",
    "short_audio",
    "silence",
    "clipping",
    "low_sample_rate",
    "overlong",
    "noise",
)

# ------------------------------------------------------------------ measures

DURATION = "duration_s"
VOICED_FRACTION = "voiced_fraction"
F0_HZ = "f0_median_hz"
F0_ST = "f0_median_st"
F1, F2, F3 = "f1_hz", "f2_hz", "f3_hz"
FORMANT_INDEX = "formant_index"
F4 = "f4_hz"
VTL_INDEX = "vtl_index"
#: F4: NaN where a file has no fourth formant below the ceiling (voicebias.instruments.formants)
OPTIONAL_FORMANT_MEASURES = (F4,)
#: the composite's choice of formant term (params acoustics.formant_term)
FORMANT_TERMS = (FORMANT_INDEX, VTL_INDEX)
H1_H2 = "h1_h2_db"
H1_H2_CORRECTED = "h1_h2_corrected_db"
H1_A3 = "h1_a3_db"
H1_A3_CORRECTED = "h1_a3_corrected_db"
CPPS = "cpps_db"
HNR = "hnr_db"

#: voice-quality measures (voicebias.instruments.harmonics, .cpps, .harmonicity)
VOICE_QUALITY_MEASURES = [H1_H2, H1_H2_CORRECTED, H1_A3, H1_A3_CORRECTED, CPPS, HNR]
#: every acoustic measure of a file (voicebias.instruments.acoustics)
MEASURE_COLUMNS = [
    DURATION,
    VOICED_FRACTION,
    F0_HZ,
    F0_ST,
    F1,
    F2,
    F3,
    FORMANT_INDEX,
    F4,
    VTL_INDEX,
    *VOICE_QUALITY_MEASURES,
]
#: the voice-quality measures of the SC study (manipulation check, continuation scoring, preservation)
SC_MEASURES = (H1_H2, H1_A3, CPPS)
#: the instrument's components (voicebias.instruments.acoustics.COMPONENTS) the SC stages
#: measure: F0 and formants, the harmonic levels (H1-H2, H1-A3) and CPPS; not HNR
SC_COMPONENTS = ("pitch", "formants", "harmonics", "cpps")

# ------------------------------------------------------------------ tables

#: data/passages/passages.csv (voicebias.stimuli.bank)
PASSAGE_COLUMNS = [
    "passage_id",
    "lang",
    "pole",
    "theme",
    "seed_term",
    "seed_source",
    "seed_statistic",
    "statistic_checked",
    "text",
    "gloss_en",
    "length_units",
    "intensity",
    "rated_by",
    "review_status",
]
#: data/stimuli/manifest.csv (voicebias.stimuli.passages)
STIMULUS_COLUMNS = [
    "stimulus_id",
    "passage_id",
    "lang",
    "pole",
    "voice_gender",
    "voice_id",
    "backend",
    "sample_rate",
    "duration_s",
    "gain_db",
    "sha256",
    "path",
]
#: data/sc_stimuli/prompts.csv (voicebias.stimuli.prompts)
SC_PROMPT_COLUMNS = ["prompt_id", "prompt_set", "category", "lang", "text", "review_status", "source"]
#: data/sc_stimuli/manifest.csv (voicebias.stimuli.prompts)
SC_STIMULUS_COLUMNS = [
    "stimulus_id",
    "prompt_id",
    "prompt_set",
    "category",
    "lang",
    "voice_gender",
    "voice_id",
    "backend",
    "sample_rate",
    "duration_s",
    "gain_db",
    "sha256",
    "path",
    "text",
]
#: data/phonation/manifest.csv (voicebias.stimuli.phonation)
PHONATION_COLUMNS = [
    "stimulus_id",
    "source_stimulus_id",
    "prompt_id",
    "prompt_set",
    "category",
    "lang",
    "voice_gender",
    "voice_id",
    "phonation",
    "backend",
    "sample_rate",
    "duration_s",
    "sha256",
    "path",
    "text",
    "status",
    "error",
    "peak_limited",
]
#: data/continuum/manifest.csv (voicebias.pipeline.continuum): one row per continuum step, the
#: manipulation check's measures and verdict beside its targets; voice_id and voice_gender name the
#: base voice the step was made from
CONTINUUM_COLUMNS = [
    "stimulus_id",
    "source_stimulus_id",
    "passage_id",
    "lang",
    "pole",
    "voice_id",
    "voice_gender",
    "step",
    "x_st",
    "f0_target_hz",
    "formant_index_target",
    "formant_ratio",
    "f0_hz",
    "formant_index",
    "f0_error_st",
    "formant_error_oct",
    "passed",
    "reason",
    "sample_rate",
    "duration_s",
    "sha256",
    "path",
]
#: data/responses/<system>/<task>/responses.csv (voicebias.systems.runner)
RESPONSE_COLUMNS = [
    "system",
    "task",
    "stimulus_id",
    "passage_id",
    "lang",
    "target_lang",
    "pole",
    "voice_gender",
    "voice_id",
    "prompt",
    "transcript",
    "status",
    "reason",
    "error",
    "output_audio",
    "output_sha256",
    "output_duration_s",
    "model_revision",
    "attempts",
    "cache_key",
    "adapter",
    "transcript_source",
    "provenance",
]
#: repeat index of an answer (0 .. run.samples_per_item - 1): a column of the responses, scored and
#: acoustic tables only when more than one answer is drawn per item, right after stimulus_id
SAMPLE = "sample"


def with_sample(columns: list[str]) -> list[str]:
    """`columns` with the sample column after stimulus_id (the layout of a table with repeats)."""
    i = columns.index("stimulus_id") + 1
    return [*columns[:i], SAMPLE, *columns[i:]]


#: the columns that name one cell of the disaggregated table (reports/disaggregated/disaggregated.csv)
#: and of the whole-run replicates' tables (reports/replicates)
CELL_KEYS = ("study", "system", "task", "lang", "voice_gender", "condition_factor", "condition", "metric")

#: stimulus columns the responses table carries when the stimulus table has them
RESPONSE_STIMULUS_COLUMNS = ["passage_id", "pole", "voice_gender", "voice_id", "phonation"]
#: data/continuations/<system>/responses.csv: a responses table of the phonation stimuli
CONTINUATION_COLUMNS = [*RESPONSE_COLUMNS, "phonation"]
#: columns the transcript scoring adds to a responses table (data/scored/<system>.csv, voicebias.scoring.text)
TRANSCRIPT_SCORE_COLUMNS = ["judged_gender", "pronouns_male", "pronouns_female", "pronoun_choice"]
#: data/sc_scored/<system>.csv (voicebias.scoring.continuation), followed by the judge rubric's dimensions
SC_SCORED_COLUMNS = [
    "system",
    "stimulus_id",
    "prompt_id",
    "prompt_set",
    "lang",
    "voice_gender",
    "voice_id",
    "phonation",
    "status",
    "reason",
    "error",
    "transcript",
    "prompt_text",
    "output_audio",
    "speaker_similarity",
    *SC_MEASURES,
    F0_ST,
    "measure_status",
    "judge_status",
    "judge_error",
    "judge_name",
    "judge_version",
]
