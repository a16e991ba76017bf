"""The UI's pool of sessions: one generation per loaded session, bounded memory, clear errors."""

from __future__ import annotations

import threading

import pytest

from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.pool import ModelPool
from edgespec.service.session import Session

OPTS = RuntimeOptions(n_ctx=256)


def test_a_busy_instance_is_never_leased_twice_and_the_third_lease_waits():
    pool = ModelPool(OPTS, per_key=2)
    with pool.lease("smollm2-135m") as a, pool.lease("smollm2-135m") as b:
        assert isinstance(a, Session) and a is not b and a.target is not b.target and pool.active() == 2
        got = threading.Event()

        def third() -> None:
            with pool.lease("smollm2-135m") as c:
                assert c in (a, b)
                got.set()

        th = threading.Thread(target=third)
        th.start()
        assert not got.wait(1.0), "a third lease must wait for a free instance"
    th.join(timeout=30)
    assert got.is_set() and pool.active() == 0
    assert pool.loaded() == ["SmolLM2-135M-Instruct.Q4_1.gguf x2"]


def test_the_least_recently_used_idle_instance_is_freed_to_make_room():
    from edgespec.models.derive import derive_pair

    q8, _ = derive_pair()
    pool = ModelPool(OPTS, per_key=2, max_slots=2)
    with pool.lease("smollm2-135m"), pool.lease("smollm2-135m"):
        pass
    with pool.lease(str(q8)):
        assert sorted(pool.loaded()) == ["SmolLM2-135M-Instruct.Q4_1.gguf x1", f"{q8.name} x1"]


def test_unknown_or_undownloaded_models_fail_with_one_line():
    pool = ModelPool(OPTS)
    with pytest.raises(EdgeSpecError, match="unknown model"):
        with pool.lease("no-such-model"):
            pass
    with pytest.raises(EdgeSpecError, match="not downloaded yet"):
        with pool.lease("qwen2.5-0.5b-instruct"):
            pass
    assert pool.active() == 0


def test_a_draft_model_stays_loaded_in_its_session_between_leases():
    pool = ModelPool(OPTS, per_key=1)
    with pool.lease("smollm2-135m") as s:
        drafter = s.drafter("model:smollm2-135m")
        assert drafter is not None and drafter.name.startswith("model:")
    with pool.lease("smollm2-135m") as again:
        assert again is s and again.drafter("model:smollm2-135m") is drafter
    pool.close()
    assert pool.loaded() == []
