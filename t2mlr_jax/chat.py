"""Chat with a model in the terminal, tokens printed as they are generated.

    python -m t2mlr_jax.chat --model=SmolLM2-135M-Instruct.Q4_1.gguf
    python -m t2mlr_jax.chat --model=HF_DIR_OR_EXPORT_OR_WORKDIR --prompt="Hello!"

--model: a GGUF file, a Hugging Face directory, a parameter export or a training workdir
(the tokenizer comes from the model, a task's own vocabulary for a run of S5 or variable
assignment, or --tokenizer=DIR). The conversation is rendered
with the tokenizer's chat template; the prompt is non-recurrent (control flow 1, as chat
and SFT models are trained) unless --prompt_control_flow=2. Interactive commands:
/reset (new conversation), /quit. --prompt answers once and exits.
"""

import sys

from absl import flags

from t2mlr_jax import cli


def main(argv=None):
  """`python -m t2mlr_jax.chat --model=PATH`: an interactive chat in the terminal."""
  model = flags.DEFINE_string("model", None, "GGUF file, HF directory, export or workdir",
                              required=True)
  tokenizer = flags.DEFINE_string("tokenizer", None, "directory with tokenizer.json "
                                  "(default: the model's)")
  prompt = flags.DEFINE_string("prompt", None, "answer this one message and exit")
  system = flags.DEFINE_string("system", None, "a system message")
  max_new = flags.DEFINE_integer("max_new_tokens", 256, "answer length limit")
  temperature = flags.DEFINE_float("temperature", 0.0, "0 = greedy")
  top_k = flags.DEFINE_integer("top_k", None, "sample from the k likeliest tokens")
  top_p = flags.DEFINE_float("top_p", None, "nucleus sampling mass")
  seed = flags.DEFINE_integer("seed", 0, "sampling seed")
  cf = flags.DEFINE_integer("prompt_control_flow", 1, "1: non-recurrent prompt (chat/SFT "
                            "models); 2: recurrent")
  max_seq_len = flags.DEFINE_integer("max_seq_len", 2048, "context limit of the chat "
                                     "(capped by the model's)")
  stats = flags.DEFINE_bool("stats", False, "print compile time, time to first token and "
                            "decode tokens/s")

  def run(argv):
    del argv
    # the library (and JAX) load once the flags parse: argument errors print at once
    from t2mlr_jax.convert import loading
    from t2mlr_jax.serving.chat_session import ChatSession, stats_line
    from t2mlr_jax.train import tasks
    cli.quiet_absl_logs()
    cfg, params, found = loading.load_model_and_tokenizer(model.value, tokenizer=tokenizer.value,
                                                          field="--model",
                                                          own=tasks.own_tokenizer)
    tok = found.tokenizer
    cfg = cfg.replace(max_seq_len=min(cfg.max_seq_len, max_seq_len.value))
    session = ChatSession(cfg, params, tok, system=system.value,
                          max_new_tokens=max_new.value, temperature=temperature.value,
                          top_k=top_k.value, top_p=top_p.value, seed=seed.value,
                          prompt_control_flow=cf.value)

    def say(piece):
      sys.stdout.write(piece)
      sys.stdout.flush()

    def answer(text):
      try:
        info = session.reply(text, say)
      except ValueError as e:
        print(f"error: {e}")
        return
      print()
      if stats.value:
        print(stats_line(info))

    if prompt.value is not None:
      answer(prompt.value)
      return
    print("(/reset: new conversation, /quit or Ctrl-D: exit)")
    while True:
      try:
        text = input("you> ")
      except (EOFError, KeyboardInterrupt):
        print()
        return
      if text.strip() == "/quit":
        return
      if text.strip() == "/reset":
        session.reset()
        continue
      if text.strip():
        say("model> ")
        answer(text)
  cli.run(run, argv)


if __name__ == "__main__":
  main()
