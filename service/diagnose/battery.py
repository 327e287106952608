"""The battery a diagnosis submits, planned from a model's config facts alone (a pure function).

Three lines of evidence, each an ordinary job:

- behaviour: answers in a random order with filler of two lengths before the answer request, so position,
  answer slot and token distance move apart, and (for a model with a window) the answers' distances fall on
  both sides of the window; `explain` reads it.
- intervention: the same design on other trials (another seed), under the baseline and every variant the
  config allows (`global-only` where layers slide, `rope-base:x4` where the RoPE base is known, and on the
  fake engine a position gap); `compare` reads each against the baseline, paired.
- mechanism: the hf engine's attention by layer kind on a small subset, with and without a position gap,
  and the same trials answered on the battery's engine (the answers the attention is scored against: an hf
  job teacher-forces its sheet), when the model is small enough for one device (never on the fake engine,
  which records no attention).
"""

from __future__ import annotations

import hashlib
import json

from posbias.schemas import EngineOptions, FakeSpec, JobSpec, ModelInfo, PosbiasError
from posbias.schemas.diagnosis import Battery, BatteryJob, Line
from posbias.workers import engines

BATCH_SIZE = 10
"""N of every job: long enough for a curve, short enough for a small model's context."""
MIN_BATCH_SIZE = 4
"""The least N a battery is planned at when N = 10 does not fit the model's context: fewer positions leave
no curve to speak of."""
DEFAULT_BUDGET = 2000
"""Trials in all when `--budget` is not given."""
MIN_CLUSTERS = 16
"""Sampled sets per filler length and job at least: the cluster bootstrap holds its level from 16 on."""
ROPE_FACTOR = 4
"""`rope-base:x4`: distances read as a quarter as far, which a RoPE decay would show."""
FAR = 4096
"""Filler (tokens) for a model without a window, and the fake's position gap: long enough for a decay."""
HF_MAX_PARAMETERS = 10_000_000_000
"""Largest model the mechanism line plans the hf engine for (one device; bigger needs its own plan)."""
MECHANISM_TRIALS = 32
"""Sampled sets per filler length of each mechanism job at least: attention is read per answer and layer, so
a small subset says where it goes. The AUROC's percentile bootstrap by trial holds its level from about 64
trials: at 16 sets a filler (32 trials) it covered 91-92% and implicated the window in 4-7% of simulated
batteries where neither the window nor attention acts, at 32 sets 93-94% and 3% (benchmarks/
mechanism_coverage.py)."""
MECHANISM_SHARE = 62
"""Budget trials per mechanism sampled set beyond the least: the mechanism jobs take about a tenth of the
budget (32 sets a filler length at the default 2,000), so a larger --budget narrows the mechanism line's
intervals as it does the others'."""


def plan_battery(
    facts: ModelInfo,
    *,
    engine: str = str(EngineOptions().name),
    budget: int = DEFAULT_BUDGET,
    fake: FakeSpec | None = None,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
) -> Battery:
    """The jobs that diagnose `facts.name` within `budget` trials, every one at `batch_size` questions a
    prompt. Raises `PosbiasError` naming the least budget when `budget` cannot give each job the trials its
    intervals need."""
    window = facts.sliding_window if facts.sliding_window_layers else None
    fillers = (0, round(0.8 * window)) if window else (0, _far(facts))
    is_fake = engines.declared(str(engine)).reads_fake
    base = {
        "model": facts.name,
        "revision": facts.revision,
        "engine": {"name": str(engine)},
        "batch_sizes": [batch_size],
        "answer_mode": "constrained",
        "answer_order": "random",
        "filler": {"tokens": list(fillers), "where": "end"},
        "seed": seed,
    }
    if fake is not None:
        base["fake"] = fake.model_dump(mode="json")
    variants = _variants(facts, fake=fake, window=window)
    notes: list[str] = []
    if not variants:
        notes.append("intervention: the config states no window and no RoPE base, so no variant applies")
    mechanism = not is_fake and (facts.num_parameters or 0) <= HF_MAX_PARAMETERS
    if is_fake:
        notes.append("mechanism: the fake engine records no attention; on a real model, hf jobs read it")
    elif not mechanism:
        notes.append(f"mechanism: {facts.num_parameters:,} parameters is more than one device's hf plan")
    sets = max(MECHANISM_TRIALS, budget // MECHANISM_SHARE)
    reserved = 3 * sets * len(fillers) if mechanism else 0
    shares = 1 + len(variants) + (1 if variants else 0)  # behaviour, then baseline + each variant
    per_share = (budget - reserved) // shares
    iterations = per_share // len(fillers)
    if iterations < MIN_CLUSTERS:
        least = MIN_CLUSTERS * len(fillers) * shares + reserved
        raise PosbiasError(
            f"a budget of {budget:,} trials leaves {max(iterations, 0)} sampled sets a job; give --budget "
            f"{least:,} or more ({MIN_CLUSTERS} sets per filler length and job at least)"
        )
    digest = _digest(facts, engine=engine, budget=budget, fake=fake, seed=seed, batch_size=batch_size)
    jobs = [
        BatteryJob(
            line=Line.behaviour,
            purpose="separate position, answer slot and token distance (explain)",
            key=f"diagnose/{digest}/behaviour",
            spec=JobSpec.build({**base, "iterations": iterations}, source="diagnose's plan"),
        )
    ]
    if variants:
        jobs.append(
            BatteryJob(
                line=Line.intervention,
                purpose="each variant against the baseline on the same trials (compare)",
                key=f"diagnose/{digest}/intervention",
                spec=JobSpec.build(
                    {**base, "seed": seed + 1, "iterations": iterations, "variants": ["baseline", *variants]},
                    source="diagnose's plan",
                ),
            )
        )
    if mechanism:
        hf = {**base, "seed": seed + 2, "iterations": sets, "answer_mode": "constrained"}
        for name, gap in (("mechanism", None), ("mechanism-gap", _far(facts))):
            options: dict[str, object] = {"name": _attention_engine(), "answer_sheet": "gold"}
            if gap is not None:
                options["position_gap"] = gap
            jobs.append(
                BatteryJob(
                    line=Line.mechanism,
                    purpose="attention by layer kind"
                    + (f", position ids moved by {gap:,} (RoPE apart from the window)" if gap else ""),
                    key=f"diagnose/{digest}/{name}",
                    spec=JobSpec.build({**hf, "engine": options}, source="diagnose's plan"),
                )
            )
        jobs.append(
            BatteryJob(
                line=Line.mechanism,
                purpose="the hf jobs' trials answered on this engine: what their attention is scored against",
                key=f"diagnose/{digest}/mechanism-scored",
                spec=JobSpec.build(hf, source="diagnose's plan"),
            )
        )
    return Battery(
        model=facts.name,
        facts=facts,
        budget=budget,
        batch_size=batch_size,
        digest=digest,
        jobs=tuple(jobs),
        notes=tuple(notes),
    )


def _far(facts: ModelInfo) -> int:
    """A distance long enough for a decay and inside the context."""
    if facts.context_length:
        return min(FAR, facts.context_length // 4)
    return FAR


def _variants(facts: ModelInfo, *, fake: FakeSpec | None, window: int | None) -> list[object]:
    """The interventions the config allows; a fake answers them only through its mechanism."""
    if fake is not None and fake.mechanism is None:
        return []
    found: list[object] = []
    if window:
        found.append("global-only")
    if facts.rope_theta:
        found.append(f"rope-base:x{ROPE_FACTOR}")
    if fake is not None:
        gap = _far(facts)
        found.append({"name": f"gap-{gap}", "fake": {"mechanism": {"position_gap": gap}}})
    return found


def _digest(
    facts: ModelInfo, *, engine: str, budget: int, fake: FakeSpec | None, seed: int, batch_size: int
) -> str:
    """The plan's identity: the same model, engine, budget, seed and batch size give the same jobs' keys
    (the default batch size leaves the digest as it was before it could change)."""
    data: list[object] = [
        facts.name,
        facts.revision,
        str(engine),
        budget,
        seed,
        None if fake is None else fake.model_dump(mode="json"),
    ]
    if batch_size != BATCH_SIZE:
        data.append(batch_size)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _attention_engine() -> str:
    """The engine whose declaration says it records attention (the mechanism line's)."""
    found = [d.name for d in engines.every() if d.records_attention]
    if not found:
        raise PosbiasError("no engine records attention here, so diagnose has no mechanism line to plan")
    return found[0]
