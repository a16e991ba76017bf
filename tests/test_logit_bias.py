"""logit_bias (OpenAI's request field): the bias is added to every row a target pass scores, before the
repetition penalties as in llama.cpp's sampler chain, so speculation stays lossless with respect to the
biased distribution; on the real SmolLM2 through a session and through `serve`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgespec.core.sampling import SamplingParams, add_bias, penalize
from edgespec.models.loader import RuntimeOptions
from edgespec.runtime.errors import EdgeSpecError
from edgespec.service.session import Request, Session
from tests.test_server import error_of, start_server, stop_server
from tests.test_user_defects_4_server import KEYS, post

MAX_TOKENS = 24
PROMPT = "List the days of the week, separated by commas: Monday, Tuesday,"


def test_bias_comes_before_the_penalties_on_every_row():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(4, 30)).astype(np.float32)
    context, draft = [5, 5, 8], [5, 2, 9]
    bias = ((5, 2.5), (2, -math.inf), (5, 0.5), (29, -1.0))  # 5 twice: both count
    params = SamplingParams(repeat_penalty=1.5, logit_bias=bias)
    rows = penalize(logits, context, draft, params)
    for i in range(4):  # row i: the bias, then the penalty of the tokens seen before it
        x = float(logits[i, 5]) + 3.0
        assert rows[i, 5] == pytest.approx(x / 1.5 if x > 0 else x * 1.5)
        assert rows[i, 2] == -math.inf
        assert rows[i, 29] == pytest.approx(float(logits[i, 29]) - 1.0)  # never seen: bias only
        assert rows[i, 7] == logits[i, 7]
    only = penalize(logits, context, draft, SamplingParams(logit_bias=((3, 1.0),)))
    assert np.array_equal(only[:, 3], logits[:, 3] + 1.0) and np.array_equal(only[:, 4], logits[:, 4])
    row = np.zeros(10, dtype=np.float32)
    add_bias(row, SamplingParams(logit_bias=((4, 1.0), (12, 5.0))))  # 12 past a shorter vocabulary: skipped
    assert row[4] == 1.0 and row.sum() == 1.0


@pytest.mark.parametrize("bias, msg", [(((-1, 1.0),), "negative"), (((3, math.nan),), "must be a number"),
                                       (((3, math.inf),), "must be a number")])
def test_bad_biases_are_one_line_errors(bias, msg):
    with pytest.raises(EdgeSpecError, match=msg):
        SamplingParams(logit_bias=bias)


@pytest.fixture(scope="module")
def session(smollm2_path):
    s = Session.load(str(smollm2_path), RuntimeOptions(n_ctx=1024, flash_attn="off"))
    yield s
    s.close()


def run(session: Session, sampling: SamplingParams, draft: str = "none", gamma: str = "0") -> list[int]:
    """The prompt as it is (raw framing, as `serve`'s completions feed it), greedy unless `sampling` says."""
    req = Request(text=PROMPT, framing="raw", draft=draft, gamma=gamma, max_tokens=MAX_TOKENS, sampling=sampling,
                  reuse_prefix=False)
    return session.run(req).tokens


def test_speculation_is_lossless_under_a_bias(session):
    plain = run(session, SamplingParams())
    banned = (plain[0], plain[2])  # the answer's own tokens
    params = SamplingParams(logit_bias=tuple((t, -math.inf) for t in banned) + ((plain[5], -100.0),))
    biased = run(session, params)
    assert biased != plain and not set(banned) & set(biased) and plain[5] not in biased, (plain, biased)
    for gamma in ("4", "auto"):  # the n-gram drafter copies the prompt, banned tokens included
        assert run(session, params, "ngram", gamma) == biased
    # a bias that favours a token: greedy picks it at every step
    favoured = run(session, SamplingParams(logit_bias=((plain[1], 100.0),)))
    assert favoured == [plain[1]] * len(favoured)
    # seeded sampling: the same tokens with and without speculation, none of them banned
    hot = SamplingParams(temperature=0.9, seed=7, logit_bias=params.logit_bias)
    sampled = run(session, hot)
    assert run(session, hot, "ngram", "4") == sampled and not set(banned) & set(sampled)


def test_a_token_outside_the_vocabulary_is_refused(session):
    with pytest.raises(EdgeSpecError, match=r"token id 49152 is not in .*vocabulary \(0\.\.49151\)"):
        run(session, SamplingParams(logit_bias=((49152, 1.0),)))


@pytest.fixture(scope="module")
def server():
    served = start_server("--target", "smollm2-135m", "--draft", "ngram", "--ctx", "1024", "--flash-attn", "off",
                          "--api-key", KEYS)
    yield served
    stop_server(served)


def test_serve_takes_logit_bias(server, session):
    """Through `serve` (n-gram drafts): the same tokens as the session's plain decoding under the same bias."""
    plain = run(session, SamplingParams())
    bias = {str(plain[0]): False, str(plain[3]): -100}
    want = run(session, SamplingParams(logit_bias=((plain[0], -math.inf), (plain[3], -100.0))))
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    r = post(server, "/v1/completions", {**body, "logit_bias": bias})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == session.target.detokenize(want) != session.target.detokenize(plain)
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say yes."}],
                                                 "max_tokens": 8, "temperature": 0, "logit_bias": {"1": 5}})
    assert chat.status_code == 200, chat.text
    for bad, msg in (({"abc": 1}, "keys are token ids"), ({"5": 300}, "from -100 to 100"),
                     ({"5": True}, "or false to ban"), ({"49152": 1}, "not in")):
        r = post(server, "/v1/completions", {**body, "logit_bias": bad})
        err = error_of(r)
        assert r.status_code == 400 and msg in err["message"], (bad, r.text)
