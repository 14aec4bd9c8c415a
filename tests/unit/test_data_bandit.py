"""The source bandit: reproducible phases, allowed lengths, weights that follow loss progress."""

from __future__ import annotations

import numpy as np

from andrea.data.bandit import EXPLORE, PHASE_LENGTHS, PhaseSchedule, SourceBandit, phase_length

SOURCES = ["docs", "code", "prose"]


def test_schedule_is_reproducible_from_the_seed():
    a = PhaseSchedule(42).phases_until(5000)
    assert PhaseSchedule(42).phases_until(5000) == a
    assert [length for _, _, length in PhaseSchedule(43).phases_until(5000)] != \
           [length for _, _, length in a]
    # Asking about a late step first gives the same schedule as walking from the start.
    late = PhaseSchedule(42)
    assert late.locate(4999) == next(p for p in a if p[1] <= 4999 < p[1] + p[2])


def test_phase_lengths_only_from_the_allowed_set():
    lengths = [phase_length(seed, k) for seed in range(20) for k in range(200)]
    assert set(lengths) == set(PHASE_LENGTHS)          # all five occur, nothing else
    phases = PhaseSchedule(0).phases_until(3000)
    assert [s for _, s, _ in phases] == list(np.cumsum([0] + [n for *_, n in phases])[:-1])


def _feed(bandit: SourceBandit, steps: range, losses) -> None:
    for step in steps:
        bandit.report(step, dict(enumerate(losses(step))))


def test_weights_move_toward_the_source_whose_loss_improves():
    bandit = SourceBandit(0, SOURCES)
    assert np.allclose(bandit.weights_at(0), 1 / 3)   # nothing reported yet: uniform
    # "code" keeps improving; the others are flat (already learned).
    _feed(bandit, range(0, 400), lambda s: (3.0, 5.0 * 0.997 ** s, 4.0))
    w = bandit.weights_at(400)
    assert w.argmax() == 1 and w[1] > 0.5
    assert np.all(w >= EXPLORE / 3 - 1e-12) and abs(w.sum() - 1) < 1e-12   # no source starves
    # Then "prose" starts improving and "code" plateaus: the weights follow.
    _feed(bandit, range(400, 900), lambda s: (3.0, 1.5, 4.0 * 0.997 ** (s - 400)))
    assert bandit.weights_at(900).argmax() == 2


def test_equal_progress_gives_equal_weights():
    bandit = SourceBandit(1, SOURCES)
    _feed(bandit, range(300), lambda s: (4.0 * 0.998 ** s,) * 3)
    assert np.allclose(bandit.weights_at(300), 1 / 3)


def test_decisions_are_frozen_and_reproducible():
    a, b = SourceBandit(5, SOURCES), SourceBandit(5, SOURCES)
    curve = lambda s: (3.0, 5.0 * 0.99 ** s, 4.0)   # noqa: E731
    _feed(a, range(200), curve)
    _feed(b, reversed(range(200)), curve)                 # order of arrival does not matter
    _feed(b, range(200), lambda s: (9.0, 9.0, 9.0))       # resends are ignored
    assert [p.weights for p in (a.phase_at(199), a.phase_at(250))] == \
           [p.weights for p in (b.phase_at(199), b.phase_at(250))]
    served = a.phase_at(250)
    _feed(a, range(200, 260), lambda s: (1.0, 9.0, 1.0))  # late reports
    assert a.phase_at(250) == served                      # already served: unchanged
    assert [p.index for p in a.phases()] == list(range(served.index + 1))


def test_a_phase_waits_for_the_reports_it_depends_on():
    """Phase k is decided from the reports of phases <= k - 2, all of them: a decision never
    depends on how far telemetry had got when the batch was asked for."""
    import threading

    import pytest

    from andrea.data.bandit import NotReady

    curve = lambda s: (3.0, 5.0 * 0.99 ** s, 4.0)   # noqa: E731
    phases = PhaseSchedule(7).phases_until(400)
    k = 4
    need = phases[k - 1][1] - 1                       # record steps 1..need
    early = SourceBandit(7, SOURCES, wait_s=0.05)
    _feed(early, range(1, need), curve)               # one step short
    with pytest.raises(NotReady, match=f"steps 1..{need}"):
        early.phase_at(phases[k][1])
    # The missing report arrives while a request waits: it decides then, from exactly the
    # reports it needs, and equals a bandit that had every report (and more) from the start.
    early.wait_s = 10
    threading.Timer(0.1, lambda: _feed(early, range(need, need + 1), curve)).start()
    late = SourceBandit(7, SOURCES, wait_s=0)
    _feed(late, range(1, 400), curve)
    assert early.phase_at(phases[k][1]) == late.phase_at(phases[k][1])


def test_a_step_counts_as_reported_only_with_all_its_sources():
    """A record's losses go in together: a decision made while they are going in (a batch
    request on another thread) waits for the last of them, and equals the decision of a bandit
    that had them all. (It once counted the step after its first source: such a decision missed
    the others' losses, and the batch differed from the same step's after a resume.)"""
    import threading
    from collections.abc import Mapping

    curve = lambda s: (3.0, 5.0 * 0.99 ** s, 4.0)   # noqa: E731
    phases = PhaseSchedule(7).phases_until(400)
    k = 4       # phase k's estimates hold step `need`'s losses (phase k - 2's last step)
    need = phases[k - 1][1] - 1                       # phase k waits for steps 1..need
    first_in, decided = threading.Event(), threading.Event()

    class SlowRecord(Mapping):      # step `need`'s losses, the second held back for a while
        def __init__(self):
            self.d = dict(enumerate(curve(need)))

        def __getitem__(self, k):
            return self.d[k]

        def __len__(self):
            return len(self.d)

        def __iter__(self):
            for i, k in enumerate(self.d):
                if i == 1:
                    first_in.set()
                    decided.wait(0.5)     # the decision below comes now, if it does not wait
                yield k

    torn = SourceBandit(7, SOURCES, wait_s=10)
    _feed(torn, range(1, need), curve)
    reporter = threading.Thread(target=torn.report, args=(need, SlowRecord()))
    reporter.start()
    assert first_in.wait(10)
    got = torn.phase_at(phases[k][1])
    decided.set()
    reporter.join()
    whole = SourceBandit(7, SOURCES, wait_s=0)
    _feed(whole, range(1, need + 1), curve)
    assert got == whole.phase_at(phases[k][1])


def test_a_step_without_usable_losses_still_counts_as_reported():
    bandit = SourceBandit(2, SOURCES, wait_s=0.01)
    _feed(bandit, range(1, 300), lambda s: (3.0, 4.0, 5.0))
    phases = PhaseSchedule(2).phases_until(300)
    bandit_gap = SourceBandit(2, SOURCES, wait_s=0.01)
    _feed(bandit_gap, [s for s in range(1, 300) if s != 5], lambda s: (3.0, 4.0, 5.0))
    bandit_gap.report(5, {0: float('nan')})          # its loss was not finite
    assert bandit_gap.phase_at(phases[3][1]).index == 3


def test_a_bandit_over_some_sources_is_the_bandit_of_those_alone():
    """A run that picks sources mixes over them as if they were the whole corpus: its weights on
    the picked sources are exactly those of a bandit over the picked ones alone, 0 elsewhere."""
    import pytest

    curve = lambda s: (3.0, 9.9, 5.0 * 0.99 ** s, 4.0)   # noqa: E731  (index 1 is not picked)
    some = SourceBandit(6, ["docs", "tests", "code", "prose"],
                        active=[True, False, True, True])
    alone = SourceBandit(6, ["docs", "code", "prose"])
    _feed(some, range(300), curve)
    _feed(alone, range(300), lambda s: [x for i, x in enumerate(curve(s)) if i != 1])
    for step in (0, 100, 299):
        w = some.weights_at(step)
        assert w[1] == 0 and np.array_equal(w[[0, 2, 3]], alone.weights_at(step))
    assert some.weights_at(299).argmax() == 2
    every = SourceBandit(6, SOURCES, active=[True] * 3)        # all picked: the plain bandit
    plain = SourceBandit(6, SOURCES)
    _feed(every, range(200), lambda s: (3.0, 5.0 * 0.99 ** s, 4.0))
    _feed(plain, range(200), lambda s: (3.0, 5.0 * 0.99 ** s, 4.0))
    assert every.phase_at(199) == plain.phase_at(199)
    with pytest.raises(ValueError, match="no source to train on"):
        SourceBandit(6, SOURCES, active=[False] * 3).weights_at(0)
