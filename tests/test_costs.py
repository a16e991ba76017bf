"""The stored cost profile: measured on first use with progress reported while it runs, and resumed
after an interruption from the part already measured."""

from __future__ import annotations

import json

import pytest

from edgespec.runtime import profiles
from edgespec.runtime.llama import Model

ROWS = [1, 2, 4, 8]


@pytest.fixture
def fresh_model(smollm2_path, tmp_path, monkeypatch):
    """A model of its own (no profile loaded in this process) with an empty profile store."""
    monkeypatch.setenv("EDGESPEC_PROFILES", str(tmp_path))
    model = Model(smollm2_path, n_ctx=256, n_threads=1)  # a test of the bookkeeping, not of speed
    yield model
    model.close()


def test_an_interrupted_profile_resumes_from_what_it_saved(fresh_model):
    model = fresh_model
    seen: list[float] = []

    def ctrl_c_in_the_second_timed_round(fraction: float) -> None:
        seen.append(fraction)
        # rounds over the rows: a warm-up, then three timed ones, each 1/4 of the work (by rows)
        if fraction > 0.5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        profiles.profile(model, ROWS, progress=ctrl_c_in_the_second_timed_round)
    assert seen[0] == 0 and seen == sorted(seen)
    stored = json.loads(profiles.profile_path(model).read_text())
    assert stored["pass_s"] == {}  # nothing finished ...
    assert {int(k): len(v) for k, v in stored["partial"].items()} == {k: 1 for k in ROWS}  # ... one round kept

    resumed: list[float] = []
    prof = profiles.profile(model, ROWS, progress=resumed.append)
    # the saved round counts as done (a quarter of the work by rows: 15 of 60), and only a warm-up
    # and the two missing timed rounds run: 3 passes per row count instead of 4
    assert resumed[0] == pytest.approx(0.25) and resumed[-1] == pytest.approx(1.0)
    assert len(resumed) == 1 + 3 * len(ROWS)
    assert set(prof.pass_s) == set(ROWS) and all(t > 0 for t in prof.pass_s.values())
    stored = json.loads(profiles.profile_path(model).read_text())
    assert set(stored["pass_s"]) == {str(k) for k in ROWS} and not stored["partial"]
    again: list[float] = []
    profiles.profile(model, ROWS, progress=again.append)
    assert again == []  # measured and stored: progress is only reported while measuring


def test_saved_samples_count_and_the_fastest_is_kept(fresh_model):
    """A resumed measurement keeps what was timed before, and a pass's cost is the fastest of its
    repeats: a (made-up) saved sample of 1 ns stays the first of the three and is the result; a huge
    one (a stalled pass) is not."""
    samples = {1: [1e-9]}
    got = profiles.measure_pass_costs(fresh_model, [1], repeats=3, samples=samples)
    assert samples[1][0] == 1e-9 and len(samples[1]) == 3 and got[1] == 1e-9
    samples = {1: [1000.0]}
    got = profiles.measure_pass_costs(fresh_model, [1], repeats=3, samples=samples)
    assert got[1] == min(samples[1][1:]) < 1000.0


def test_a_disturbed_measurement_is_measured_again(fresh_model, capsys):
    """A measurement in which every repeat of one row count stalled (T(1) of 2 s beside passes over
    more rows of about 10 ms, as a profile measured while a test suite ran read) is not kept: the
    row counts are measured again from scratch, and what is stored is plausible. The stalled samples
    are planted as an interrupted measurement's saved ones, which the next measurement resumes from."""
    model = fresh_model
    path = profiles.profile_path(model)
    path.write_text(json.dumps({"pass_s": {}, "partial": {"1": [2.0, 2.0, 2.0], "2": [0.010] * 3,
                                                           "4": [0.011] * 3, "8": [0.012] * 3}}))
    prof = profiles.profile(model, ROWS)
    assert profiles.implausible({1: 2.0, 2: 0.010, 4: 0.011, 8: 0.012}) == (1, 2)
    assert profiles.implausible(prof.pass_s) is None and prof.pass_s[1] < 1.0
    assert "implausible (T(2) 10.0 ms below T(1) 2000.0 ms)" in capsys.readouterr().err
    stored = json.loads(path.read_text())
    assert {int(k): v for k, v in stored["pass_s"].items()} == prof.pass_s and not stored["partial"]
