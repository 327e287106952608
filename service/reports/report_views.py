"""One report's reads, shared between its views: each batch size's answers read from the store once, and one
set of bootstrap draws for a position curve and the token-distance curve of the same clusters.

A report shows, per variant and batch size, the curve by position, the curve by token distance and
explain's fit (`service/reports/report_data.py`), each computed by the function its own command calls
(`service/reports/curves.py`). Each command reads the job's answers on its own, so one report process read
them three times (twice whole, once by distance) and drew the same bootstrap draws twice. `SharedReads` is
what the report hands those functions instead of the store, and what it gives each view is what the view's
own command gives:

- `trial_data`: a (variant, batch size)'s answers, read once with their slots and distances (a superset of
  what each view reads; curves by position and comparisons read neither) and kept for the report's other
  views, up to `KEPT_ANSWERS` answers besides the last one read.
- `distances`: the answers by token distance, taken from each batch size's arrays instead of read again
  where they are the same answers: one job, no trial left out of its pool as a duplicate, and as many
  answers as the store's running totals count (else that batch size's are read from the store, as the
  command reads them: a batch size of 1 often shows a question twice). Each trial is its own row there, in
  trial id order, with the cluster its trial data gives it: the rows, their order and their clusters are
  the command's, so the curve is too (its sums of the gold option's probability may be added in another
  order: equal to about 1e-16).
- `draws`: a curve's bootstrap resamples. A cluster bootstrap's draws depend only on the number of
  clusters, the number of resamples and the seed (`bootstrap.single`), so a distance curve whose clusters
  are those of its batch size's position curve (every trial has a distance) is resampled in one pass with
  the position curve, with the very draws each would have drawn alone: every estimate, interval and band is
  the command's, to the last bit. Each curve's intervals keep the coverage `benchmarks/coverage.py`
  measures, since each is computed from the same draws as before; only the draws are not made twice.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Collection, Sequence

import numpy as np

from posbias.service.reports.curves import StoreReads
from posbias.service.stats import DistanceColumns, TrialData, bootstrap, queries
from posbias.service.store import Database

KEPT_ANSWERS = 2_000_000
"""Answers (trials x positions) a report keeps read besides the last (56 bytes each with their slots and
distances: 112 MB); past it the longest unused batch size is read again when asked for."""

_Key = tuple[tuple[int, ...], int, str]


class SharedReads(StoreReads):
    """A report's reads of the store, shared between its views (see the module's docstring)."""

    def __init__(self, *, kept: int = KEPT_ANSWERS) -> None:
        self._kept = kept
        self._data: OrderedDict[_Key, TrialData] = OrderedDict()
        self._paired: list[TrialData] = []
        """The position data whose distances `distances` gave last: a distance curve of the same clusters
        draws with it."""
        self._pending: list[tuple[weakref.ref[TrialData], int, int, bootstrap.Resampled]] = []
        """Draws made with a distance curve's, waiting for their position curve: (its data, resamples, seed,
        draws). Weak: data no longer kept is read again, and drawn again, alike."""
        self.store_reads = 0
        """Trial data read from the store (`trial_data` calls that were not served from memory)."""
        self.passes = 0
        """Bootstrap passes made (one per curve, or one for two curves that share their draws)."""

    def trial_data(
        self, db: Database, *, job_ids: Collection[int], batch_size: int, variant: str, placement: bool = True
    ) -> TrialData:
        """`queries.trial_data` with slots and distances, read once per report while it is kept."""
        key = (tuple(sorted(set(job_ids))), batch_size, variant)
        found = self._data.get(key)
        if found is not None:
            self._data.move_to_end(key)
            return found
        found = queries.trial_data(db, job_ids=key[0], batch_size=batch_size, variant=variant)
        self.store_reads += 1
        self._data[key] = found
        while len(self._data) > 1 and sum(d.correct.size for d in self._data.values()) > self._kept:
            self._data.popitem(last=False)
        return found

    def distances(
        self,
        db: Database,
        *,
        job_ids: list[int],
        batch_size: int | None,
        sizes: Sequence[int],
        variant: str,
        rope: bool,
    ) -> tuple[DistanceColumns, dict[int, int]]:
        """The answers by token distance, from each batch size's trial data where they are the same answers
        (see the module's docstring); else from the store."""
        if not rope and len(job_ids) == 1:
            derived = self._derived(db, job_ids[0], sizes=sizes, variant=variant)
            if derived is not None:
                return derived
        return super().distances(
            db, job_ids=job_ids, batch_size=batch_size, sizes=sizes, variant=variant, rope=rope
        )

    def _derived(
        self, db: Database, job_id: int, *, sizes: Sequence[int], variant: str
    ) -> tuple[DistanceColumns, dict[int, int]] | None:
        stored: dict[int, int] = {}
        for count in queries.curve_counts(db, job_id=job_id, variant=variant):
            stored[count.batch_size] = stored.get(count.batch_size, 0) + count.n
        if sum(stored.get(n, 0) for n in sizes) > self._kept:
            return None  # not kept for the other views: the store's distances alone are the cheaper read
        derived: list[TrialData] = []
        parts: list[DistanceColumns] = []
        clusters: dict[int, int] = {}
        row = cluster = -(2**62)  # below every stored trial id: a derived trial is its row, from here on
        read = False
        for n in sizes:
            data = self.trial_data(db, job_ids=[job_id], batch_size=n, variant=variant)
            if data.duplicates or data.distance is None or int(data.answered.sum()) != stored.get(n, 0):
                # Not the same answers (a batch size of 1 often shows a question twice): the store's.
                parts.append(queries.token_distance_rows(db, job_ids=[job_id], batch_size=n, variant=variant))
                if not read:
                    clusters.update(queries.clusters_of(db, job_ids=[job_id]))
                    read = True
                continue
            rows, cols = np.nonzero(data.answered > 0)
            parts.append(
                DistanceColumns(
                    trial_id=rows + row,
                    batch_size=np.full(rows.size, n, dtype=np.int64),
                    token_distance=data.distance[rows, cols],
                    parsed=data.parsed[rows, cols] > 0,
                    correct=data.correct[rows, cols] > 0,
                    gold_prob=data.gold_prob[rows, cols],
                )
            )
            clusters.update(
                zip(range(row, row + data.trials), (data.cluster + cluster).tolist(), strict=True)
            )
            row += data.trials
            cluster += data.clusters
            derived.append(data)
        # A filler sweep's position curves are one per filler length, of other sums: none to draw with.
        self._paired = [data for data in derived if len(data.filler_levels()) == 1]
        return (parts[0] if len(parts) == 1 else DistanceColumns.concatenate(parts)), clusters

    def draws(self, data: TrialData, *, resamples: int, seed: int) -> bootstrap.Resampled:
        """`bootstrap.single`'s draws: a distance curve's made together with those of its batch size's
        position curve when their clusters are the same, which the position curve then finds made (see
        the module's docstring); any other curve's made for it alone."""
        self._pending = [p for p in self._pending if p[0]() is not None]
        for index, (made, r, s, found) in enumerate(self._pending):
            if made() is data and (r, s) == (resamples, seed):
                del self._pending[index]
                return found
        self.passes += 1
        own = any(data is kept for kept in self._data.values())  # a position curve's: nothing to wait for
        self._paired = [d for d in self._paired if d is not data]
        partner = next(
            (
                d
                for d in self._paired
                if d.batch_size == data.batch_size and np.array_equal(d.cluster, data.cluster)
            ),
            None,
        )
        if own or partner is None:
            return bootstrap.single(data, resamples=resamples, seed=seed)
        self._paired = [d for d in self._paired if d is not partner]
        sums = data.cluster_sums()
        units = np.arange(sums[0].shape[0], dtype=np.int64)  # as `single` numbers them
        mine, theirs = bootstrap.bootstrap(
            [sums, partner.cluster_sums()],
            strata=[units],
            membership=[units, units],
            resamples=resamples,
            seed=seed,
        )
        self._pending.append((weakref.ref(partner), resamples, seed, theirs))
        return mine
