"""Toy tasks (server/tasks.py): problems made deterministically from (seed, step, split),
each answer right, held-out problems never trained on, and the accuracy rule (the run routes
that serve them instead of the corpus: tests/api/test_tasks_routes.py)."""

from __future__ import annotations

import numpy as np
import pytest

from andrea import tasks
from andrea.run_config import RunConfig

TRUE_ANSWER = {
    "copy": lambda p: p[:-1],
    "reverse": lambda p: p[:-1][::-1],
    "sort": lambda p: "".join(sorted(p[:-1])),
}


def true_answer(task: str, prompt: str, digits: int) -> str:
    if task in TRUE_ANSWER:
        return TRUE_ANSWER[task](prompt)
    a, b = prompt[:-1].split("+")
    if task == "add":
        return f"{int(a) + int(b):0{digits + 1}d}"
    return f"{(int(a) + int(b)) % 97:02d}"


def problems(task: str, tokens: np.ndarray) -> list[tuple[str, str]]:
    """(prompt, answer) of each whole problem of each row, read back from the text."""
    f = tasks.facts(task, None if task == "mod" else 4)
    out = []
    for row in tokens:
        text = tasks.decode(row)
        for s in range(0, len(text) - f.problem_len + 1, f.problem_len):
            p = text[s:s + f.problem_len]
            assert p[-1] == "\n", p
            out.append((p[:f.answer_start], p[f.answer_start:f.answer_start + f.answer_len]))
    return out


@pytest.mark.parametrize("task", tasks.TASKS)
def test_every_problem_of_a_batch_has_its_true_answer(task):
    digits = None if task == "mod" else 4
    tok = tasks.rows(task, digits, seed=5, step=3, split="train", B=6, T=63)
    assert tok.shape == (6, 64) and tok.dtype == np.uint32 and tok.max() < len(tasks.ALPHABET)
    got = problems(task, tok)
    assert len(got) >= 6
    for prompt, answer in got:
        n = tasks.task_digits(task, digits)
        assert answer == true_answer(task, prompt, n), (prompt, answer)


def test_batches_are_a_function_of_seed_step_and_split():
    a = tasks.rows("reverse", 6, 1, 10, "train", 4, 40)
    assert np.array_equal(a, tasks.rows("reverse", 6, 1, 10, "train", 4, 40))
    for other in [(2, 10, "train"), (1, 11, "train"), (1, 10, "val")]:
        assert not np.array_equal(a, tasks.rows("reverse", 6, *other, 4, 40))


@pytest.mark.parametrize("task", ["reverse", "add"])
def test_held_out_prompts_are_never_trained_on(task):
    def prompts(split):
        return {p for s in range(20)
                for p, _ in problems(task, tasks.rows(task, 4, 0, s, split, 8, 63))}
    train, val = prompts("train"), prompts("val")
    assert len(train) > 400 and len(val) > 400
    assert not train & val
    # A tenth of the prompts are held out (FNV-1a), whichever split drew them.
    rng = np.random.default_rng(1)
    share = np.mean([tasks._held_out(tasks._problem(task, 4, rng)[0])
                     for _ in range(4000)])
    assert 0.08 < share < 0.12


def test_mod_holds_out_half_the_pairs_chosen_by_the_seed():
    held = tasks._mod_held_out(0)
    assert held.shape == (97, 97) and held.sum() == 97 * 97 - int(0.5 * 97 * 97)
    assert not np.array_equal(held, tasks._mod_held_out(1))
    def pairs(split):
        return {(int(p[:2]), int(p[3:5])) for s in range(30)
                for p, _ in problems("mod", tasks.rows("mod", None, 0, s, split, 8, 63))}
    train, val = pairs("train"), pairs("val")
    assert not train & val
    assert all(not held[a, b] for a, b in train) and all(held[a, b] for a, b in val)


def test_exact_match_counts_whole_answers_in_the_row():
    f = tasks.facts("reverse", 3)            # "123>321\n": L 8, answer at 4..7
    tok = tasks.rows("reverse", 3, 0, 0, "train", 2, 19)   # 20 tokens: problems at 0, 8; 16 cut
    pred = tok[:, 1:].copy()
    assert tasks.exact_match(tok, pred, f) == (4, 4)
    pred[0, 8 + 4 - 1] += 1                  # row 0, second problem, its first answer token
    assert tasks.exact_match(tok, pred, f) == (3, 4)
    pred = tok[:, 1:].copy()
    pred[:, 16 + 4 - 1:] = 0                 # the cut third problem is not counted
    pred[:, 0:3] = 0                         # nor is a wrong prompt token
    assert tasks.exact_match(tok, pred, f) == (4, 4)


def test_the_alphabet_is_a_hugging_face_tokenizer_with_the_same_ids():
    text = "0123456789+=>\n42+07=049\n"
    assert tasks.tokenizer().encode(text).ids == tasks.encode(text)
    assert tasks.tokenizer().decode(tasks.encode(text)) == text


def test_a_task_run_config_has_the_alphabet_vocabulary_and_its_digits():
    c = RunConfig(preset="tiny", task="add")
    assert (c.vocab_size, c.task_digits) == (tasks.VOCAB, 3)
    assert RunConfig(preset="tiny", task="mod").task_digits == 2
    for bad, why in [({"task": "reverse", "vocab_size": 512}, "give no vocab_size"),
                     ({"task_digits": 3}, "give a task too"),
                     ({"task": "mod", "task_digits": 3}, "2 digits"),
                     ({"task": "add", "task_digits": 31}, "less than or equal to 30"),
                     ({"task": "sort", "data_mode": "bandit"}, "no sources"),
                     ({"task": "nope"}, "'copy'")]:
        with pytest.raises(ValueError, match=why):
            RunConfig(preset="tiny", **bad)
