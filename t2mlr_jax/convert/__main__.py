"""Convert between Hugging Face directories and t2mlr_jax checkpoints.

    python -m t2mlr_jax.convert --from-hf HF_DIR --to OUT [--l_start=4 --l_end=-5]
        HF (Llama / SmolLM2 / Qwen2, safetensors) -> a parameter export OUT (Orbax
        params + model.json + the tokenizer files) that training starts from with
        --config.model.init_from=OUT. With --l_start/--l_end a T2MLR block is added
        (γ = 0: the model still computes the pretrained function).
    python -m t2mlr_jax.convert --from-hf HF_DIR --to OUT --recurrence=lrt \
            --recurrence_field init=identity [--recurrence_field source_layer=-1 ...]
        any recurrence type that declares how it is added to a pretrained model (its
        `retrofit`), its fields given as KEY=VALUE; --user_module=FILE.py[,...] imports
        a file registering a type of one's own first.
    python -m t2mlr_jax.convert --from-gguf MODEL.gguf --to OUT [--l_start=.. --l_end=..]
        a Llama-architecture GGUF file (any quantisation the gguf package reads,
        dequantized) -> a parameter export OUT with tokenizer.json and
        tokenizer_config.json rebuilt from the file's metadata (chat template included).
    python -m t2mlr_jax.convert --from RUN_OR_EXPORT --to-hf HF_DIR [--dtype=bfloat16]
        a training workdir (latest or --step checkpoint) or an export -> HF directory
        (base weights loadable by transformers; recurrence in t2mlr_recurrence.safetensors).
    python -m t2mlr_jax.convert --from-official-lrt CKPT_DIR [--step=N] --to OUT
        a checkpoint of the official LRT release (model_NNNNNN.pt + meta_NNNNNN.json;
        interleaved or multi-refine, any gate width) -> a parameter export OUT; the
        schedule it was trained with is printed (evaluate it with --mode=that schedule).
    python -m t2mlr_jax.convert --from RUN_OR_EXPORT --to-official-lrt CKPT_DIR \
            [--schedule=interleaved|multi_refine]
        an LRT run or export -> the release's checkpoint files (its build_model loads
        them); the schedule by default the run's train.mode (an export's: interleaved).
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil

from t2mlr_jax import cli

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")


def copy_tokenizer(src: str, dst: str, overwrite: bool = True) -> list[str]:
  """Copy the tokenizer files (TOKENIZER_FILES) src has into dst; with overwrite=False,
  those dst already has are kept."""
  copied = []
  for name in TOKENIZER_FILES:
    if not overwrite and os.path.isfile(os.path.join(dst, name)):
      continue
    if os.path.isfile(os.path.join(src, name)):
      shutil.copy(os.path.join(src, name), os.path.join(dst, name))
      copied.append(name)
  return copied


# a retrofit's gate gain, for a type with that field (T2MLR: small gates on a pretrained
# stream), unless --gate_gain or --recurrence_field gives one
RETROFIT_GATE_GAIN = 1e-2


def _field_value(name: str, text: str, types: dict):
  """A --recurrence_field value as its field's type (text where the field is unknown:
  the config names it)."""
  if name not in types:
    return text
  typ, optional = types[name]
  if optional and text.lower() == "none":
    return None
  if typ is bool:
    if text.lower() in ("true", "false"):
      return text.lower() == "true"
  elif typ in (int, float, tuple):
    try:
      return tuple(ast.literal_eval(text)) if typ is tuple else typ(text)
    except (ValueError, SyntaxError, TypeError):
      pass
  else:
    return text
  what = {bool: "true or false", int: "an int", float: "a float", tuple: "a tuple"}[typ]
  raise ValueError(f"--recurrence_field {name}={text!r} is invalid: allowed "
                   f"{what}{' or None' if optional else ''}")


def recurrence_from_args(args):
  """The recurrence config a command line asks for (None: none): --recurrence=TYPE (by
  default T2MLR when --l_start/--l_end are given) with --l_start/--l_end/--gate_gain and
  each --recurrence_field KEY=VALUE as its fields."""
  from t2mlr_jax import config, registry
  name = args.recurrence
  if name is None and args.l_start is not None:
    name = registry.default_recurrence().name
  if name is None:
    return None
  cls = registry.RECURRENCES.get(name, "--recurrence").config
  types = config.field_types(cls) if cls is not None else {}
  fields = {k: getattr(args, k) for k in ("l_start", "l_end", "gate_gain")
            if getattr(args, k) is not None}
  for item in args.recurrence_field:
    key, eq, text = item.partition("=")
    if not eq or not key:
      raise ValueError(f"--recurrence_field={item!r} is invalid: allowed KEY=VALUE")
    fields[key] = _field_value(key, text, types)
  if cls is None:
    if fields:
      raise ValueError(f"--recurrence={name!r} has no fields: got {sorted(fields)}")
    return None
  if "gate_gain" in types:
    fields.setdefault("gate_gain", RETROFIT_GATE_GAIN)
  return config.recurrence_from_dict({"type": name, **fields})


def _official_lrt(args) -> None:
  """--from-official-lrt (a release checkpoint -> an export) or --to-official-lrt."""
  from t2mlr_jax import checkpoint
  from t2mlr_jax.convert import official_lrt
  if args.from_official_lrt:
    checkpoint.check_export_target(args.to)
    cfg, params, schedule, meta = official_lrt.load_official_checkpoint(
        args.from_official_lrt, args.step)
    checkpoint.export(cfg, params, args.to)
    print(f"wrote {args.to} ({cfg.num_params():,} parameters; the release's step "
          f"{meta.get('step')}, trained with schedule {schedule or 'none (plain GPT)'})")
    return
  cfg, params = checkpoint.load(args.from_ckpt, args.step)
  steps = checkpoint.saved_steps(args.from_ckpt)      # none: an export
  mode = (checkpoint.load_config(args.from_ckpt, args.step).train.get("mode", "auto")
          if steps else "auto")
  schedule = args.schedule or official_lrt.schedule_of_mode(cfg, mode)
  step = args.step if args.step is not None else (steps[-1] if steps else 0)
  path = official_lrt.save_official_checkpoint(cfg, params, args.to_official_lrt, step,
                                               schedule)
  print(f"wrote {path} and its meta_{step:06d}.json (schedule {schedule})")


def main(argv=None):
  p = argparse.ArgumentParser(prog="python -m t2mlr_jax.convert", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--from-hf", dest="from_hf", help="Hugging Face model directory")
  src.add_argument("--from-gguf", dest="from_gguf", help="Llama-architecture GGUF file")
  src.add_argument("--from", dest="from_ckpt", help="training workdir or parameter export")
  src.add_argument("--from-official-lrt", dest="from_official_lrt",
                   help="checkpoint directory of the official LRT release")
  p.add_argument("--to", help="output parameter export (with --from-hf, --from-gguf or "
                 "--from-official-lrt)")
  p.add_argument("--to-hf", dest="to_hf", help="output Hugging Face directory (with --from)")
  p.add_argument("--to-official-lrt", dest="to_official_lrt",
                 help="output checkpoint directory of the official LRT release (with --from)")
  p.add_argument("--schedule", default=None, help="--to-official-lrt: the release's training schedule to record "
                 "(default: the run's train.mode)")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (with --from or --from-official-lrt; default the latest)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  p.add_argument("--l_start", type=int, default=None, help="add T2MLR from this layer")
  p.add_argument("--l_end", type=int, default=None, help="... to this layer (inclusive)")
  p.add_argument("--gate_gain", type=float, default=None,
                 help=f"gate init gain (retrofit; default {RETROFIT_GATE_GAIN})")
  p.add_argument("--recurrence", default=None, help="the recurrence type to add (default: "
                 "T2MLR with --l_start/--l_end, else none)")
  p.add_argument("--recurrence_field", action="append", default=[], metavar="KEY=VALUE",
                 help="a field of the recurrence's config (repeatable)")
  p.add_argument("--user_module", action="append", default=[], metavar="FILE.py",
                 help="Python files imported first, registering types of one's own "
                 "(comma-separated, repeatable)")
  p.add_argument("--verbose", action="store_true", help="show the full traceback of an error")
  args = p.parse_args(argv)
  if (args.from_hf or args.from_gguf or args.from_official_lrt) and not args.to:
    p.error("--from-hf / --from-gguf / --from-official-lrt need --to OUT")
  if args.recurrence is None and (args.l_start is None) != (args.l_end is None):
    p.error("give both --l_start and --l_end to add a T2MLR block")
  if args.from_ckpt and bool(args.to_hf) == bool(args.to_official_lrt):
    p.error("--from needs one of --to-hf HF_DIR or --to-official-lrt CKPT_DIR")
  if args.schedule and not args.to_official_lrt:
    p.error("--schedule goes with --to-official-lrt")
  if (args.from_ckpt or args.from_official_lrt) and (
      args.recurrence or args.recurrence_field or args.l_start is not None):
    p.error("--recurrence, --recurrence_field and --l_start/--l_end go with --from-hf or "
            "--from-gguf")
  # the library (and JAX) load once the arguments parse: argument errors print at once
  from t2mlr_jax import checkpoint, registry
  from t2mlr_jax.convert import gguf, hf, loading

  for path in (f for v in args.user_module for f in v.split(",") if f):
    registry.import_user_module(path)
  if args.from_official_lrt or args.to_official_lrt:
    _official_lrt(args)
    return
  if args.from_hf or args.from_gguf:
    recurrence = recurrence_from_args(args)
    checkpoint.check_export_target(args.to)       # before reading a multi-GB source
    if args.from_gguf:
      cfg, copied = gguf.export_gguf(args.from_gguf, args.to, recurrence=recurrence,
                                     dtype=args.dtype)
      print(f"wrote {args.to} ({cfg.num_params():,} parameters; tokenizer files: {copied})")
      return
    cfg, params = hf.from_hf(args.from_hf, recurrence=recurrence)
    checkpoint.export(cfg, params, args.to)
    copied = copy_tokenizer(args.from_hf, args.to)
    print(f"wrote {args.to} ({cfg.num_params():,} parameters; tokenizer files: {copied})")
  else:
    cfg, params = checkpoint.load(args.from_ckpt, args.step)
    hf.check_llama_compatible(cfg)             # refuse before any note or directory
    try:              # the tokenizer the model came with (a workdir's data or init_from)
      found = loading.find_tokenizer(args.from_ckpt, args.step)
    except ValueError as e:
      print(f"note: {e}; writing the model without one")
      found = None
    tok = None if found is None or not hasattr(found.tokenizer, "save") else found.tokenizer
    hf.to_hf(cfg, params, args.to_hf, dtype=args.dtype, tokenizer=tok)
    copied = (["tokenizer.json", "tokenizer_config.json"] if tok is not None else [])
    copied += [c for c in copy_tokenizer(args.from_ckpt, args.to_hf, overwrite=tok is None)
               if c not in copied]
    print(f"wrote {args.to_hf} (tokenizer files: {copied})")


if __name__ == "__main__":
  cli.guard(main)
