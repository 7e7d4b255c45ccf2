"""Generated examples as training data: their token layout, and a random-access source: example i is a pure function of (base_seed,
i), drawn again (seed (base_seed, i, k), k = 1, 2, ...) while it is longer than `limit`
tokens, so a fixed seq_len holds every example of a task whose sizes vary (the longest
draws' tail is cut: the distribution changes there)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

MAX_DRAWS = 100


class GeneratedSource:
  """`make(seed)` -> a token dict (input_ids, target_ids, control_flow) per index."""

  def __init__(self, num_examples: int, make: Callable[[tuple], dict], *, base_seed: int = 0,
               limit: Optional[int] = None, name: str = "GeneratedSource", details: str = ""):
    for field, value, least in (("num_examples", num_examples, 1), ("limit", limit, 16)):
      if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                or value < least):
        raise ValueError(f"{field}={value!r} is invalid: allowed integers >= {least}")
    self.num_examples, self.base_seed, self.limit = int(num_examples), int(base_seed), limit
    self.make, self.name, self.details = make, name, details

  def __len__(self) -> int:
    return self.num_examples

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    if not 0 <= int(index) < self.num_examples:
      raise IndexError(f"index={index} is out of range: allowed 0..{self.num_examples - 1}")
    for draw in range(MAX_DRAWS):
      out = self.make((self.base_seed, int(index)) + ((draw,) if draw else ()))
      if self.limit is None or len(out["input_ids"]) <= self.limit:
        return out
    raise ValueError(f"limit={self.limit} is invalid for these knobs: {MAX_DRAWS} draws of "
                     f"example {index} were all longer; allowed a larger limit")

  def __repr__(self) -> str:
    return (f"{self.name}(num_examples={self.num_examples}, base_seed={self.base_seed}, "
            f"limit={self.limit}{', ' + self.details if self.details else ''})")


def prompt_response_example(prompt_ids: Sequence[int], response_ids: Sequence[int], *,
                            recurrent_prompt: bool = False) -> dict[str, np.ndarray]:
  """input_ids = prompt + response (the caller adds <bos> and <eos>), target_ids the next
  token on the response only (the last prompt position predicts its first token; -100
  elsewhere), control_flow 2 on the response and 1 on the prompt, or 2 there too except
  its first token with recurrent_prompt (the release's CONTROL_FLOW_ALL_RECURRENT)."""
  prompt, response = list(prompt_ids), list(response_ids)
  ids = np.asarray(prompt + response, np.int32)
  cf = np.asarray([1] + [2 if recurrent_prompt else 1] * (len(prompt) - 1)
                  + [2] * len(response), np.int32)
  targets = np.full(len(ids), -100, np.int32)
  targets[len(prompt) - 1:-1] = response
  return dict(input_ids=ids, target_ids=targets, control_flow=cf)
