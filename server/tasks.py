"""Toy tasks: problems a small transformer visibly learns in seconds, instead of the corpus.

Each task makes fixed-length problems from a character alphabet, deterministically from
(seed, step, split, row): a problem is its prompt, its answer and an end mark, e.g. reverse
with 5 digits is `31415>51413` then a newline. A batch row is problems laid end to end from
its first token, cut at T + 1 tokens, so every problem starts at a multiple of the problem's
length and the answer's positions in a row are known from the task alone (`TaskFacts`): the
page's exact-match accuracy needs no other information (static/js/engine/task_eval.js).

    task      prompt                answer                          problem length
    copy      n digits, '>'         the same digits                 2n + 2
    reverse   n digits, '>'         them reversed                   2n + 2
    sort      n digits, '>'         them in ascending order         2n + 2
    add       a '+' b '=' (n digits each, zero-padded)  a + b in n + 1 digits   3n + 4
    mod       a '+' b '=' (2 digits each, a, b < 97)    (a + b) mod 97 in 2     9

Held-out problems are never trained on: for copy, reverse, sort and add a problem whose
prompt's hash falls in one tenth of the hash space is held out; for mod (grokking), half of the
97 x 97 pairs are held out, chosen by the run's seed. Training draws problems again until one
is not held out, validation until one is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Literal, get_args

import numpy as np

# The alphabet: a token id is its character's index. "\n" ends a problem (id 0, as the corpus
# tokenizer's end of text is). The model's vocabulary is the alphabet padded to VOCAB.
ALPHABET = "\n0123456789+=>"
VOCAB = 16
END = "\n"
Task = Literal["copy", "reverse", "sort", "add", "mod"]
TASKS: tuple[str, ...] = get_args(Task)
DEFAULT_DIGITS = {"copy": 10, "reverse": 10, "sort": 10, "add": 3, "mod": 2}
MAX_DIGITS = 30
MODULUS = 97
HELD_OUT_TENTHS = 1          # copy, reverse, sort, add: a tenth of the prompts held out
MOD_TRAIN_FRACTION = 0.5     # mod: half the pairs trained on (grokking's usual split)
_SPLIT_KEY = {"train": 0, "val": 1}
TOKENIZER_KEY = "task"       # GET /api/tokenizer/task: the alphabet, every task's


@dataclass(frozen=True)
class TaskFacts:
    """What the page needs to read a task run's batches: the alphabet (token id -> character),
    each problem's length, and where its answer lies in it."""
    task: str
    digits: int
    alphabet: str
    problem_len: int            # L: problems start at multiples of L in every row
    answer_start: int           # the answer's first character's offset in a problem
    answer_len: int             # its characters (the end mark is not part of it)

    def to_dict(self) -> dict:
        return asdict(self)


def facts(task: str, digits: int | None = None) -> TaskFacts:
    n = task_digits(task, digits)
    if task in ("copy", "reverse", "sort"):
        return TaskFacts(task, n, ALPHABET, 2 * n + 2, n + 1, n)
    if task == "add":
        return TaskFacts(task, n, ALPHABET, 3 * n + 4, 2 * n + 2, n + 1)
    return TaskFacts(task, n, ALPHABET, 9, 6, 2)


def task_digits(task: str, digits: int | None) -> int:
    """The task's digits: the run's, or the task's default; mod's are always 2 (its numbers
    are below 97)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: one of {', '.join(TASKS)}")
    if task == "mod":
        if digits not in (None, 2):
            raise ValueError(f"task 'mod' has 2 digits (numbers below {MODULUS}), not {digits}")
        return 2
    n = DEFAULT_DIGITS[task] if digits is None else digits
    if not 1 <= n <= MAX_DIGITS:
        raise ValueError(f"task_digits must be in [1, {MAX_DIGITS}], got {n}")
    return n


def tokenizer_key(task: str | None, vocab_size: int) -> str:
    """The key of a run's tokenizer at GET /api/tokenizer/{key}: `task` for a run of a toy task
    (its `task`), or its vocab size."""
    return TOKENIZER_KEY if task else str(vocab_size)


def encode(text: str) -> list[int]:
    return [ALPHABET.index(c) for c in text]


def decode(ids) -> str:
    return "".join(ALPHABET[i] if i < len(ALPHABET) else "?" for i in ids)


def _digits(rng: np.random.Generator, n: int) -> str:
    return "".join(map(str, rng.integers(0, 10, n)))


def _held_out(prompt: str) -> bool:
    """A tenth of prompts, by a hash that is the same on every machine (FNV-1a, 32 bits)."""
    h = 0x811C9DC5
    for c in prompt.encode():
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    return h % 10 < HELD_OUT_TENTHS


@lru_cache(maxsize=64)
def _mod_held_out(seed: int) -> np.ndarray:
    """[97, 97] bool: the pairs mod holds out for a seed."""
    rng = np.random.default_rng([seed, 0x6D6F64])
    order = rng.permutation(MODULUS * MODULUS)
    held = np.zeros(MODULUS * MODULUS, bool)
    held[order[int(MOD_TRAIN_FRACTION * order.size):]] = True
    return held.reshape(MODULUS, MODULUS)


def _problem(task: str, n: int, rng: np.random.Generator) -> tuple[str, str]:
    """(prompt, answer) of one problem, held out or not."""
    if task == "mod":
        a, b = (int(x) for x in rng.integers(0, MODULUS, 2))
        return f"{a:02d}+{b:02d}=", f"{(a + b) % MODULUS:02d}"
    if task == "add":
        a, b = _digits(rng, n), _digits(rng, n)
        return f"{a}+{b}=", str(int(a) + int(b)).zfill(n + 1)
    d = _digits(rng, n)
    answer = {"copy": d, "reverse": d[::-1], "sort": "".join(sorted(d))}[task]
    return d + ">", answer


def problem(task: str, n: int, seed: int, rng: np.random.Generator, split: str
            ) -> tuple[str, str]:
    """A problem of `split`: drawn again until it is held out (val) or not (train)."""
    want = split == "val"
    while True:
        prompt, answer = _problem(task, n, rng)
        if task == "mod":
            held = bool(_mod_held_out(seed)[int(prompt[:2]), int(prompt[3:5])])
        else:
            held = _held_out(prompt)
        if held == want:
            return prompt, answer


def example(task: str, digits: int | None = None) -> tuple[str, str]:
    """One problem of the task, the same every time: (prompt, answer)."""
    f = facts(task, digits)
    return problem(task, f.digits, 0, np.random.default_rng(0), "train")


def rows(task: str, digits: int | None, seed: int, step: int, split: str, B: int, T: int
         ) -> np.ndarray:
    """[B, T + 1] uint32 tokens of a batch: each row problems end to end, cut at T + 1."""
    f = facts(task, digits)
    per_row = -(-(T + 1) // f.problem_len)
    rng = np.random.default_rng([seed, _SPLIT_KEY[split], step])
    out = np.empty((B, per_row * f.problem_len), np.uint32)
    lookup = {c: i for i, c in enumerate(ALPHABET)}
    for r in range(B):
        text = "".join(p + a + END for p, a in
                       (problem(task, f.digits, seed, rng, split) for _ in range(per_row)))
        out[r] = [lookup[c] for c in text]
    return out[:, :T + 1]


def exact_match(tokens: np.ndarray, predicted: np.ndarray, f: TaskFacts) -> tuple[int, int]:
    """(problems answered exactly, problems) of a batch: tokens [B, T + 1], predicted [B, T]
    the argmax of each position's logits (position t predicts token t + 1). A problem counts
    when its whole answer lies in the row; it is right when every answer token is predicted.
    The reference for the page's (task_eval.js), and for a PyTorch replay."""
    B, T1 = tokens.shape
    right = total = 0
    for s in range(0, T1, f.problem_len):
        first, end = s + f.answer_start, s + f.answer_start + f.answer_len
        if end > T1:
            break
        ok = (predicted[:, first - 1:end - 1] == tokens[:, first:end]).all(axis=1)
        right += int(ok.sum())
        total += B
    return right, total


@lru_cache(maxsize=1)
def tokenizer():
    """The alphabet as a Hugging Face tokenizer (one token per character, ids as ALPHABET's),
    for exports: transformers reads a task run's model with it like any other."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(ALPHABET)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok
