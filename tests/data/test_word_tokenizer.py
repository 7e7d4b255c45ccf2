"""The word tokenizer of the generated tasks: one id per word, mark and newline; canonical
text round-trips; an unknown word or a bad vocabulary is one error naming it."""

import pytest

from t2mlr_jax.data.word_tokenizer import NEWLINE_ID, WordTokenizer, split_words

TEXT = "Every wumpus is a yimpus.\nIs Tom a wumpus or yimpus?\n### Tom is a yimpus.\nA -> B | C"


def test_canonical_text_round_trips_one_token_per_word():
  words = sorted(set(split_words(TEXT)) - {"\n"})
  tok = WordTokenizer(words, "test")
  ids = tok.encode(TEXT)
  assert len(ids) == len(split_words(TEXT)) and tok.decode(ids) == TEXT
  assert ids.count(NEWLINE_ID) == 3 and tok.token_to_id["###"] in ids
  assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == TEXT
  assert split_words("a  b\t->c") == ["a", "b", "->", "c"]        # spaces are separators


def test_unknown_words_and_bad_vocabularies_are_named():
  tok = WordTokenizer(["a", "b"], "tiny")
  with pytest.raises(ValueError, match=r"the word 'c', which is not in the tiny vocabulary"):
    tok.encode("a c")
  with pytest.raises(ValueError, match=r"the word '<'"):      # special tokens are no words
    tok.encode("a <eos>")
  with pytest.raises(ValueError, match=r"vocabulary word 'a b' is invalid"):
    WordTokenizer(["a b"])
  with pytest.raises(ValueError, match=r"vocabulary 'dup' has duplicate words"):
    WordTokenizer(["a", "a"], "dup")
