"""The server's chat page in a real browser: Debian's headless Chromium driven by Selenium
with the system chromedriver (nothing downloaded). It loads offline, streams an answer
equal to the chat completion's, keeps the conversation, shows time to first token and
tokens/s, starts a new chat, and a reply can be stopped."""

import os
import time

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from serving.test_server import Running
from t2mlr_jax.convert.loading import load_model_and_tokenizer
from t2mlr_jax.serving import server as serving

from _gguf_fixtures import write_tiny_gguf

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)),
    reason="needs Debian's chromium and chromium-driver (apt-get install; .ci/run does)")


def browser():
  os.environ["SE_OFFLINE"] = "true"                 # Selenium Manager: no downloads
  options = webdriver.ChromeOptions()
  options.binary_location = CHROMIUM
  for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,800"):
    options.add_argument(arg)
  return webdriver.Chrome(service=Service(DRIVER), options=options)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
  path = tmp_path_factory.mktemp("page") / "tiny.gguf"
  write_tiny_gguf(path)
  cfg, params, found = load_model_and_tokenizer(str(path))
  run = Running(serving.Server(cfg, params, found.tokenizer, name="tiny", max_batch=2,
                             max_len=128))
  yield run
  run.stop()


def _answers(driver):
  return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")


def test_the_page_streams_answers_keeps_the_conversation_and_stops(running):
  driver = browser()
  try:
    driver.get(running.base + "/")
    wait = WebDriverWait(driver, 60)
    wait.until(lambda d: d.find_element(By.ID, "model").text == "tiny")
    box = driver.find_element(By.ID, "input")
    box.send_keys("To be, or not to be")
    driver.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_element(By.ID, "send").is_enabled() and
               d.find_elements(By.CSS_SELECTOR, ".stats") and
               d.find_elements(By.CSS_SELECTOR, ".stats")[-1].text)
    first = _answers(driver)[0].text
    stats = driver.find_elements(By.CSS_SELECTOR, ".stats")[-1].text
    assert "first token" in stats and "tokens/s" in stats
    # the page asks at temperature 0 by default: the model's greedy answer
    _, greedy, _ = running.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "To be, or not to be"}], "temperature": 0})
    assert first == greedy["choices"][0]["message"]["content"] and first
    # a second turn carries the first (the conversation is kept)
    box.send_keys("and again")
    driver.find_element(By.ID, "send").click()
    wait.until(lambda d: len(_answers(d)) == 2 and d.find_element(By.ID, "send").is_enabled())
    assert len(driver.find_elements(By.CSS_SELECTOR, ".msg.user")) == 2
    # a slow reply that does not end by itself (EOS ignored), stopped mid-way
    engine, scheduler = running.server.engine, running.server.scheduler
    real_step, eos = engine.step, scheduler.eos_id
    engine.step = lambda *a, **k: (time.sleep(0.1), real_step(*a, **k))[1]
    scheduler.eos_id = None
    try:
      driver.find_element(By.ID, "clear").click()          # a new chat: room for a long one
      assert not _answers(driver)
      box.send_keys("one more")
      driver.find_element(By.ID, "send").click()
      wait.until(lambda d: len(_answers(d)) == 1 and _answers(d)[0].text)
      driver.find_element(By.ID, "stop").click()
      wait.until(lambda d: "stopped" in d.find_elements(By.CSS_SELECTOR, ".stats")[-1].text)
      deadline = time.time() + 5
      while engine.active() and time.time() < deadline:
        time.sleep(0.05)
      assert engine.active() == 0                       # the stopped reply freed its slot
    finally:
      engine.step, scheduler.eos_id = real_step, eos
  finally:
    driver.quit()
