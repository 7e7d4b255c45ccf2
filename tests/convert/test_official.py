"""The official T2MLR release's checkpoints both ways (t2mlr_jax/convert/official.py): every
mixer's weights of the release's own modules (tests/golden/mixers_official_small) and a
whole wrapped model with its settings (options_official_small) read and written back
under the release's names, key for key and bit for bit; the settings round trip."""

import dataclasses
import json
import os

import numpy as np
import pytest

from t2mlr_jax import T2MLRConfig
from t2mlr_jax.convert import official

from _util import TESTS_DIR

GOLDEN = os.path.join(TESTS_DIR, "golden")


def _load(name):
  return (dict(np.load(os.path.join(GOLDEN, name + ".npz"))),
          json.load(open(os.path.join(GOLDEN, name + ".json"))))


def test_every_mixers_weights_go_back_under_the_release_names():
  """All 17 cases of the seven mixers (linear and MLP gates, the state MLP with its
  scaling, norms, vector and scalar γ): read, then written, give the release's weights."""
  z, meta = _load("mixers_official_small")
  D = meta["shape"][-1]
  for case, spec in meta["cases"].items():
    rcfg = T2MLRConfig(mixer=spec["mixer"], mixer_options=tuple(spec["mixer_options"].items()))
    theirs = {k.split("/param/", 1)[1]: v for k, v in z.items()
              if k.startswith(f"{case}/param/")}
    ours = official.mixer_params_from_official(theirs, rcfg, D)
    back = official.mixer_params_to_official(ours, rcfg, D)
    assert set(back) <= set(theirs), (case, sorted(set(back) - set(theirs)))
    for key, value in back.items():
      np.testing.assert_array_equal(value, theirs[key], err_msg=f"{case}: {key}")
    assert len(back) == len(list(official._leaf_paths(ours))), case   # every leaf written

@pytest.mark.parametrize("case", ["alpha_coupled_cache", "skip_to_l_end", "connection_detach"])
def test_a_wrapped_model_and_its_settings_go_back_to_the_release(case):
  """from_official + settings_from_official, then to_official: the release's state dict key
  for key (the tied head named too) and settings that read back as the same config."""
  z, meta = _load("options_official_small")
  sd = {k.split("/param/", 1)[1]: v for k, v in z.items()
        if k.startswith((f"{case}/param/", "base/param/"))}
  fields = official.settings_from_official(meta["cases"][case])
  cfg, params = official.from_official(sd, {**meta["base_config"], "architectures": [
      "LlamaForCausalLM"]}, l_start=meta["l_start"], l_end=meta["l_end"], **fields)
  back, settings = official.to_official(cfg, params)
  assert set(back) == set(sd), sorted(set(back) ^ set(sd))
  for key, value in back.items():
    np.testing.assert_array_equal(value, sd[key], err_msg=key)
  assert settings["l_start"] == 2 and settings["l_end"] == 3
  assert settings["recurrent_mixing_module_name"] == cfg.recurrence.mixer
  again = T2MLRConfig(l_start=2, l_end=3, **official.settings_from_official(settings))
  assert again == cfg.recurrence
  with pytest.raises(ValueError, match="cache_norm='rmsnorm' has no official counterpart"):
    official.settings_to_official(dataclasses.replace(cfg.recurrence, cache_norm="rmsnorm"))
