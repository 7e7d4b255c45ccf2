"""Answer extraction and matching for GSM8K(-Aug) and MATH: hand-written cases."""

import pytest

from t2mlr_jax.eval import answers as A

# --- extract_gsm8k (GSM8K-Aug's rule) ------------------------------------------------

@pytest.mark.parametrize("text, want", [
  ("<<2*3=6>>\n<<6+12=18>>\n### 18", "18"),
  ("steps\n#### 18", "18"),
  ("#### 1,234", "1234"),
  ("### -5", "-5"),
  ("### $18", "18"),
  ("### 18.", "18"),
  ("### 18.00", "18.00"),               # extraction keeps digits; matching equates
  ("###18", "18"),                      # no space after the marker
  ("#### 7 ### 8", "8"),                # the last marker wins, whichever kind
  ("### 7\n#### 9\n", "9"),
  ("### 12\nThe end.", "12"),           # first line after the marker
  ("####\n  42  \n", "42"),             # answer on the next line
  ("no marker\nso the answer is\n\n  1,000.\n\n", "1000"),  # last non-empty line
])
def test_extract_gsm8k(text, want):
  assert A.extract_gsm8k(text) == want


def test_extract_gsm8k_four_hashes_not_three_plus_one():
  # A naive split on "###" would leave "# 18" for "#### 18".
  assert A.extract_gsm8k("a\n#### 18") == "18"
  assert A.extract_gsm8k("x #### 3") != "# 3"


@pytest.mark.parametrize("text", ["", "   \n\n  ", "### ", "#### $.", "steps\n####\n\n"])
def test_extract_gsm8k_empty_is_none(text):
  assert A.extract_gsm8k(text) is None


# --- lm-eval strict / flexible -------------------------------------------------------

def test_strict_takes_first_match_and_needs_space():
  assert A.extract_strict("#### 5\nlater #### 6") == "5"
  assert A.extract_strict("####5") is None          # the pattern is "#### " + number
  assert A.extract_strict("### 5") is None          # three hashes do not count
  assert A.extract_strict("#### -1,234.") == "-1234"
  assert A.extract_strict("The answer is 18") is None


def test_flexible_takes_last_number():
  assert A.extract_flexible("3 apples cost $1,200.") == "1200"
  assert A.extract_flexible("x = -7") == "-7"
  assert A.extract_flexible("5 and 6") == "6"       # the single-digit branch
  assert A.extract_flexible("no digits here") is None


def test_flexible_follows_lm_eval_on_trailing_dots():
  # "..." matches [$0-9.,]{2,} and is the last match, as in lm-eval: nothing left.
  assert A.extract_flexible("it is 18. Done...") is None


def test_strict_and_flexible_differ():
  text = "#### 12\nWait, I made a mistake: the total is 15"
  assert A.extract_strict(text) == "12"
  assert A.extract_flexible(text) == "15"
  m = A.gsm8k_match(text, "15")
  assert m == {"spec": False, "strict": False, "flexible": True}
  # extract_gsm8k reads the first line after the (last) marker: "12"
  assert A.extract_gsm8k(text) == "12"


# --- normalize_number / answers_equal ------------------------------------------------

@pytest.mark.parametrize("s, want", [
  ("1,234", "1234"),
  ("$18", "18"),
  ("18.", "18"),
  ("18.00", "18"),
  ("18.0", "18"),
  ("18.50", "18.5"),
  ("+7", "7"),
  ("-5", "-5"),
  ("-0.0", "0"),
  (".5", "0.5"),
  ("-.25", "-0.25"),
  (" $ 1 000 ", "1000"),
  ("007", "7"),
  ("abc", "abc"),
])
def test_normalize_number(s, want):
  assert A.normalize_number(s) == want


def test_answers_equal():
  assert A.answers_equal("18.00", "18")
  assert A.answers_equal("$1,234", "1234")
  assert A.answers_equal("-5", "-5.0")
  assert A.answers_equal("0.1", "0.1000001")       # within 1e-6
  assert not A.answers_equal("0.1", "0.1001")
  assert not A.answers_equal("-5", "5")
  assert not A.answers_equal("18", "180")
  assert not A.answers_equal(None, "18")
  assert not A.answers_equal("", "")
  assert A.answers_equal("yes", "yes")              # non-numbers: string equality


# --- gsm8k_match ---------------------------------------------------------------------

def test_gsm8k_match_aug_answer_field():
  pred = "<<3*4=12>>\n<<12+6=18>>\n### 18"
  assert A.gsm8k_match(pred, "18") == {"spec": True, "strict": False, "flexible": True}
  assert A.gsm8k_match(pred, "19") == {"spec": False, "strict": False, "flexible": False}


def test_gsm8k_match_full_solution_gold():
  gold = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1,072"
  pred = "She sold 1072 clips.\n#### 1,072.00"
  assert A.gsm8k_match(pred, gold) == {"spec": True, "strict": True, "flexible": True}


def test_gsm8k_match_negative_and_dollar():
  assert A.gsm8k_match("#### -$5", "-5")["spec"]
  assert A.gsm8k_match("so\n#### $18.", "18") == {"spec": True, "strict": False,
                                                  "flexible": True}
  assert not A.gsm8k_match("#### 5", "-5")["spec"]


# --- last_boxed ----------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
  (r"so $\boxed{42}$.", "42"),
  (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
  (r"first \boxed{1} then \boxed{\sqrt{2}+\frac{3}{4}}", r"\sqrt{2}+\frac{3}{4}"),
  (r"\boxed{1} and \fbox{2}", "2"),
  (r"\fbox{7} and finally \boxed{8}", "8"),
  (r"\boxed{\{1,2\}}", r"\{1,2\}"),
  (r"\boxed{\left\{ x \right.}", r"\left\{ x \right."),   # escaped brace not counted
  (r"the answer is $\boxed 5$", "5"),
  (r"\boxed {x^{2}}", "x^{2}"),
])
def test_last_boxed(text, want):
  assert A.last_boxed(text) == want


@pytest.mark.parametrize("text", [
  "no box here",
  r"\boxed{\frac{1}{2}",          # unbalanced
  r"\boxed{1} then \boxed{2",     # the LAST box is unbalanced
  r"\boxed",
])
def test_last_boxed_none(text):
  assert A.last_boxed(text) is None


# --- normalize_math / math_match -----------------------------------------------------

@pytest.mark.parametrize("s, want", [
  (r"\dfrac{1}{2}", r"\frac{1}{2}"),
  (r"\tfrac{3}{4}", r"\frac{3}{4}"),
  (r"\frac12", r"\frac{1}{2}"),
  (r"\frac1{72}", r"\frac{1}{72}"),
  (r"\sqrt2", r"\sqrt{2}"),
  ("3/4", r"\frac{3}{4}"),
  ("0.5", r"\frac{1}{2}"),
  (".75", "0.75"),
  (r"\left( 1, 2 \right)", "(1,2)"),
  (r"90^\circ", "90"),
  (r"90^{\circ}", "90"),
  (r"\$5.50", "5.50"),
  (r"10\text{ cm}", "10"),
  (r"50\%", "50"),
  ("x = 5", "5"),
  ("k=\\frac{1}{3}", r"\frac{1}{3}"),
  (r"1,\!000", "1,000"),
  ("7.", "7"),
  (r"\frac{a}{b}", r"\frac{a}{b}"),
])
def test_normalize_math(s, want):
  assert A.normalize_math(s) == want


def test_normalize_math_leaves_long_lhs_equations():
  # Only a <=2-character left-hand side is dropped (hendrycks rule).
  assert A.normalize_math("y+x=3") == "y+x=3"


def test_math_match():
  gold_solution = r"So the answer is $\boxed{\frac{1}{2}}$."
  assert A.math_match(r"... giving $\boxed{\dfrac{1}{2}}$", gold_solution)
  assert A.math_match(r"\boxed{\frac12}", r"\frac{1}{2}")
  assert A.math_match(r"\boxed{0.5}", r"\frac{1}{2}")
  assert A.math_match(r"\boxed{18.0}", "18")
  assert A.math_match(r"\boxed{1,000}", "1000")
  assert A.math_match(r"\boxed{x = 3}", r"\boxed{3}")
  assert not A.math_match(r"\boxed{\frac{1}{3}}", r"\frac{1}{2}")
  assert not A.math_match(r"\boxed{1,2}", "12")                # a list, not a number
  assert not A.math_match("the answer is 18", "18")             # no box: no answer
  assert not A.math_match(r"\boxed{18", "18")                   # unbalanced box
