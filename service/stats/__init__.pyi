"""Typed view of `service/stats/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.service.stats.attention_explain import plan_keys as plan_keys
from posbias.service.stats.attention_explain import trial_keys as trial_keys
from posbias.service.stats.bootstrap import BOOTSTRAP_RESAMPLES as BOOTSTRAP_RESAMPLES
from posbias.service.stats.bootstrap import DIFF as DIFF
from posbias.service.stats.bootstrap import DIFF_OF_DIFFS as DIFF_OF_DIFFS
from posbias.service.stats.bootstrap import diff_band as diff_band
from posbias.service.stats.bootstrap import percentile as percentile
from posbias.service.stats.comparison import BLOCK_FRACTIONS as BLOCK_FRACTIONS
from posbias.service.stats.comparison import blocks as blocks
from posbias.service.stats.comparison import resample_pair as resample_pair
from posbias.service.stats.explain import explain_curve as explain_curve
from posbias.service.stats.trial_columns import DistanceColumns as DistanceColumns
from posbias.service.stats.trial_data import Floats as Floats
from posbias.service.stats.trial_data import TrialData as TrialData
from posbias.service.stats.window_step import BREAK_RESAMPLES as BREAK_RESAMPLES

from . import attention_curve as attention_curve
from . import attention_explain as attention_explain
from . import attention_gap as attention_gap
from . import bootstrap as bootstrap
from . import comparison as comparison
from . import options as options
from . import position_curve as position_curve
from . import queries as queries

__all__ = [
    "BLOCK_FRACTIONS",
    "BOOTSTRAP_RESAMPLES",
    "BREAK_RESAMPLES",
    "DIFF",
    "DIFF_OF_DIFFS",
    "DistanceColumns",
    "Floats",
    "TrialData",
    "attention_curve",
    "attention_explain",
    "attention_gap",
    "blocks",
    "bootstrap",
    "comparison",
    "diff_band",
    "explain_curve",
    "options",
    "percentile",
    "plan_keys",
    "position_curve",
    "queries",
    "resample_pair",
    "trial_keys",
]
