"""The personalization schedule (client/personalization.py) against schedules computed by hand."""

from __future__ import annotations

import pytest

from hetfed.client.personalization import PersonalSchedule
from hetfed.methods.decision import DecisionParams

SETTINGS = {
    "rspo-alpha": 0.01,
    "rspo-alpha-personal": 0.001,
    "anneal": True,
    "kappa-lam": 1.0,
    "kappa-lr": 0.1,
    "coupled-lr": False,
    "freeze-tau": 0.01,
    "freeze-extra-rounds": 2,
}


def schedule(settings: dict, loss: str, lam0: float, lr0: float) -> PersonalSchedule:
    """The schedule of ``loss`` for run-config values ``settings`` (the rest at their defaults)."""
    return PersonalSchedule.from_params(DecisionParams.from_config(settings), loss, lam0, lr0)


def walk(schedule: PersonalSchedule, stats: list[float]) -> list[tuple[int, float, float]]:
    """(t, lam_t, lr_t) of every round trained, with U_t = stats[t - 1]."""
    trained = []
    for t, u in enumerate(stats, 1):
        if not schedule.trains(t):
            break
        schedule.begin(t)
        trained.append((t, schedule.lam, schedule.lr))
        schedule.end(t, u)
    return trained


def test_rspo_anneals_both_schedules_freezes_at_the_first_small_gap_and_stops_two_rounds_later() -> None:
    s = schedule(SETTINGS, "rspo+", lam0=0.8, lr0=0.02)
    assert s.lr0 == pytest.approx(0.002, rel=1e-15)  # 0.02 * 0.001 / 0.01: personalization's alpha
    trained = walk(s, [0.5, 0.2, 0.009, 0.0, 0.5, 0.5, 0.5])
    expected = [  # lam0 / (1 + (t - 1)), lr0 / (1 + 0.1 (t - 1)); frozen after round 3
        (1, 0.8, 0.002),
        (2, 0.4, 0.002 / 1.1),
        (3, 0.8 / 3, 0.002 / 1.2),
        (4, 0.8 / 3, 0.002 / 1.2),
        (5, 0.8 / 3, 0.002 / 1.2),
    ]
    assert [t for t, _, _ in trained] == [1, 2, 3, 4, 5] and s.frozen_at == 3 and s.round == 5
    for (t, lam, lr), (_, lam_hand, lr_hand) in zip(trained, expected, strict=True):
        assert lam == pytest.approx(lam_hand, rel=1e-15) and lr == pytest.approx(lr_hand, rel=1e-15), t


def test_the_coupled_learning_rate_follows_lam() -> None:
    s = schedule({**SETTINGS, "coupled-lr": True}, "rspo+", lam0=2.0, lr0=1.0)
    trained = walk(s, [1.0, 1.0, 1.0])
    hand = [
        2.0,
        0.001 * 2.0 / 4,
        1.0,
        0.001 * 1.0 / 4,
        2.0 / 3,
        0.001 * (2.0 / 3) / 4,
    ]  # lam_t, alpha lam_t / 4
    assert [x for _, lam, lr in trained for x in (lam, lr)] == pytest.approx(hand, rel=1e-15)


@pytest.mark.parametrize("loss,settings", [("spo+", SETTINGS), ("rspo+", {**SETTINGS, "anneal": False})])
def test_without_annealing_lam_and_lr_stay_and_nothing_freezes(loss: str, settings: dict) -> None:
    s = schedule(settings, loss, lam0=0.8, lr0=0.02)
    trained = walk(s, [0.0] * 6)  # every U_t <= tau, and still no freeze
    lr = 0.02 * 0.001 / 0.01 if loss == "rspo+" else 0.02
    assert [t for t, _, _ in trained] == [1, 2, 3, 4, 5, 6] and s.frozen_at == 0
    assert {(lam, round(x, 15)) for _, lam, x in trained} == {(0.8, round(lr, 15))}


def test_a_resumed_schedule_continues_exactly() -> None:
    whole = schedule(SETTINGS, "rspo+", lam0=0.8, lr0=0.02)
    stats = [0.5, 0.2, 0.3, 0.001, 0.5, 0.5, 0.5, 0.5]
    reference = walk(whole, stats)
    first = schedule(SETTINGS, "rspo+", lam0=0.8, lr0=0.02)
    walk(first, stats[:4])  # the node dies after round 4 (frozen there) ...
    again = schedule(SETTINGS, "rspo+", lam0=0.8, lr0=0.02)
    again.resume(first.position())  # ... and a new one continues from the kept position
    rest = []
    for t, u in enumerate(stats, 1):
        if t <= again.round:
            continue
        if not again.trains(t):
            break
        again.begin(t)
        rest.append((t, again.lam, again.lr))
        again.end(t, u)
    assert rest == reference[4:] and [t for t, _, _ in rest] == [5, 6]
